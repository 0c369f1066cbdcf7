package failure

import (
	"strings"
	"testing"
	"time"
)

func TestParseSlow(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Slow
		wantErr string
	}{
		{in: "rank=2,factor=3", want: Slow{Rank: 2, Factor: 3, From: 1}},
		{in: "rank=0, factor=1.5, from=10, to=20", want: Slow{Rank: 0, Factor: 1.5, From: 10, To: 20}},
		{in: "rank=1", wantErr: "factor"},
		{in: "rank=-1,factor=2", wantErr: "rank"},
		{in: "rank=1,factor=0.5", wantErr: "factor"},
		{in: "rank=1,factor=2,from=5,to=4", wantErr: "to"},
		{in: "rank=1,factor=2,speed=9", wantErr: `unknown key "speed"`},
		{in: "rank=1,rank=2,factor=2", wantErr: "twice"},
		{in: "garbage", wantErr: "key=value"},
	} {
		got, err := ParseSlow(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: %v, want an error about %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %+v %v", tc.in, got, err)
		}
	}
}

func TestParsePause(t *testing.T) {
	if p, err := ParsePause("rank=1,at=30,for=2s"); err != nil || p != (Pause{Rank: 1, At: 30, For: 2 * time.Second}) {
		t.Errorf("%+v %v", p, err)
	}
	for _, bad := range []string{"rank=1,at=0,for=1s", "rank=1,at=3,for=-1s", "rank=1,at=3", "rank=x,at=3,for=1s"} {
		if _, err := ParsePause(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestInjection(t *testing.T) {
	in := Injection{
		Slow:  []Slow{{Rank: 1, Factor: 3, From: 10, To: 20}, {Rank: 2, Factor: 2, From: 1}},
		Pause: []Pause{{Rank: 0, At: 5, For: time.Second}},
	}
	for _, tc := range []struct {
		rank int
		step int64
		f    float64
	}{{1, 9, 1}, {1, 10, 3}, {1, 20, 3}, {1, 21, 1}, {2, 1, 2}, {2, 1e6, 2}, {0, 15, 1}} {
		if f := in.Factor(tc.rank, tc.step); f != tc.f {
			t.Errorf("rank %d step %d: factor %v, want %v", tc.rank, tc.step, f, tc.f)
		}
	}
	if in.PauseAt(0, 5) != time.Second || in.PauseAt(0, 6) != 0 || in.PauseAt(1, 5) != 0 {
		t.Error("pause")
	}
}

func TestParseWrongOp(t *testing.T) {
	w, err := ParseWrongOp("rank=1,at=30")
	if err != nil || w != (WrongOp{Rank: 1, At: 30}) {
		t.Errorf("%+v %v", w, err)
	}
	for _, bad := range []string{"rank=1,at=0", "rank=-1,at=3", "rank=1", "rank=1,at=3,for=1s", "at=3"} {
		if _, err := ParseWrongOp(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	in := Injection{WrongOp: []WrongOp{w}}
	if !in.WrongOpAt(1, 30) || in.WrongOpAt(1, 31) || in.WrongOpAt(0, 30) {
		t.Error("WrongOpAt answers another rank or step")
	}
}
