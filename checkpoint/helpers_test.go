package checkpoint

import "github.com/phalanx-rt/phalanx/proto/phalanxpb"

// buildManifest is the manifest of a stream held whole, as rank 0 assembles
// it from every writer's index.
func buildManifest(meta Meta, tensors []Tensor, stream []byte, l layout) *phalanxpb.Manifest {
	m := skeleton(meta, tensors, l)
	for k, o := range m.Objects {
		if err := fillShard(m, k, indexShard(m, k, stream[o.Offset:o.Offset+o.Bytes])); err != nil {
			panic(err)
		}
	}
	return m
}
