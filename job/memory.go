package job

import (
	"fmt"

	"github.com/phalanx-rt/phalanx/internal/bytesize"
	"github.com/phalanx-rt/phalanx/nn"
)

// MemoryError is a model whose training state does not fit a worker's
// budget (Config.MaxMemory).
type MemoryError struct {
	Model  string
	Need   int64 // bytes: the parameters, their gradients and the optimizer's slots
	Budget int64
	Ranks  int // tensor-parallel ranks the model is split across
}

func (e *MemoryError) Error() string {
	more := "split it across tensor-parallel ranks (--tp), if the model can be split"
	if e.Ranks > 1 {
		more = "split it across more tensor-parallel ranks (--tp)"
	}
	return fmt.Sprintf("model %s needs %s a worker at %d tensor-parallel rank(s) (parameters, gradients and optimizer slots), over the budget of %s (--max-memory): %s",
		e.Model, bytesize.Format(e.Need), e.Ranks, bytesize.Format(e.Budget), more)
}

// TrainingBytes is what training params takes in a worker: their values
// and gradients, and the optimizer's slots (cfg's optimizer), as float32.
func TrainingBytes(params []*nn.Param, cfg nn.OptimizerConfig) (int64, error) {
	var n int64
	for _, p := range params {
		n += 2 * int64(len(p.Value))
	}
	opt, err := nn.NewOptimizer(cfg, params)
	if err != nil {
		return 0, err
	}
	for _, s := range opt.Slots() {
		n += int64(len(s.Data))
	}
	return 4 * n, nil
}

// CheckMemory is a *MemoryError when training params (a worker's part
// of the model, split across ranks) needs more than c.MaxMemory (0: no
// budget).
func CheckMemory(c *Config, params []*nn.Param, ranks int) error {
	if c.MaxMemory <= 0 {
		return nil
	}
	need, err := TrainingBytes(params, c.Optimizer)
	if err != nil {
		return err
	}
	if need > c.MaxMemory {
		return &MemoryError{Model: c.Model, Need: need, Budget: c.MaxMemory, Ranks: ranks}
	}
	return nil
}
