package checkpoint

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/internal/plant"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// plantCorrupt is where the planted bug CorruptObject strikes (see
// internal/plant): object 0 of the checkpoint of step 40 is stored with a
// byte flipped after its checksums were taken.
func plantCorrupt(step int64, k int, data []byte) []byte {
	if !plant.On(plant.CorruptObject) || step != 40 || k != 0 || len(data) == 0 {
		return data
	}
	bad := append([]byte(nil), data...)
	bad[len(bad)/2] ^= 0x10
	return bad
}

// plantRewrite is the planted bug ChangeAfterSave: once the checkpoint of
// step 60 is saved, the complete checkpoint before it is rewritten with
// its objects and a manifest of its own id: still consistent, but no
// longer what was saved.
func (c *Checkpointer) plantRewrite(ctx context.Context, cur *inflight) error {
	if !plant.On(plant.ChangeAfterSave) || cur.step != 60 {
		return nil
	}
	s := c.cfg.Store
	infos, err := List(ctx, s)
	if err != nil {
		return err
	}
	var prev *Info
	for i := range infos {
		if in := &infos[i]; in.Complete && in.Step < cur.step && (prev == nil || in.Step > prev.Step) {
			prev = in
		}
	}
	if prev == nil {
		return fmt.Errorf("no checkpoint before %s", cur.id)
	}
	old, err := ReadManifest(ctx, s, prev.ID)
	if err != nil {
		return err
	}
	if old.World != cur.manifest.World {
		return fmt.Errorf("%s has another world", prev.ID)
	}
	m := proto.Clone(cur.manifest).(*phalanxpb.Manifest)
	m.Id, m.Step = prev.ID, old.Step
	for _, o := range m.Objects {
		for _, name := range []string{o.Name, indexName(o.Name)} {
			size, err := objectSize(ctx, s, cur.id+"/"+name)
			if err != nil {
				return err
			}
			b := make([]byte, size)
			if err := s.ReadAt(ctx, cur.id+"/"+name, b, 0); err != nil {
				return err
			}
			if err := s.Delete(ctx, prev.ID+"/"+name); err != nil {
				return err
			}
			if err := s.Put(ctx, prev.ID+"/"+name, b); err != nil {
				return err
			}
		}
	}
	b, err := EncodeManifest(m)
	if err != nil {
		return err
	}
	if err := s.Delete(ctx, prev.ID+"/"+ManifestName); err != nil {
		return err
	}
	return s.Put(ctx, prev.ID+"/"+ManifestName, b)
}

// objectSize is the size of the object named name.
func objectSize(ctx context.Context, s Store, name string) (int64, error) {
	objs, err := s.List(ctx, name)
	if err != nil {
		return 0, err
	}
	for _, o := range objs {
		if o.Name == name {
			return o.Size, nil
		}
	}
	return 0, fmt.Errorf("%s: %w", name, ErrNotFound)
}
