package chaos

// minioService is the MinIO server a scenario with job.store "minio" keeps
// its checkpoints in (nil: none).
func minioService(*Scenario) (Service, error) { return nil, nil }

// minioKinds are the faults on MinIO.
func minioKinds() []Kind { return nil }

// minioScenarios are the built-in scenarios of MinIO faults.
func minioScenarios() []Scenario { return nil }
