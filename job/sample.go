package job

import "github.com/phalanx-rt/phalanx/checkpoint"

// SampleConfig is a generation from a checkpoint (phalanx.Sample): the
// store (a directory or an s3:// URL) and its credentials, the
// checkpoint's name (a ring checkpoint's ID or an index's object name;
// empty: the newest that verifies, of either), and what to generate.
type SampleConfig struct {
	Checkpoint  string
	Name        string
	Credentials checkpoint.Credentials
	Generation
}
