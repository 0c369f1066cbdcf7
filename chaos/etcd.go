package chaos

// etcdService is the 3-member external etcd cluster and the coordinator
// processes a scenario with job.etcd "cluster" runs against (nil: none).
func etcdService(*Scenario) (Service, error) { return nil, nil }

// etcdKinds are the faults on the etcd cluster and the coordinators.
func etcdKinds() []Kind { return nil }

// etcdScenarios are the built-in scenarios of etcd and coordinator faults.
func etcdScenarios() []Scenario { return nil }
