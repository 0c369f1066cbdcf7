package chaos

// netnsService puts each worker of a scenario with job.network "netns" in
// a network namespace of its own (nil: none).
func netnsService(*Scenario) (Service, error) { return nil, nil }

// netnsKinds are the network faults: partitions, slow and lossy links.
func netnsKinds() []Kind { return nil }

// netnsScenarios are the built-in scenarios of network faults.
func netnsScenarios() []Scenario { return nil }
