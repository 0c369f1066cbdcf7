package events

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

func TestEmit(t *testing.T) {
	var out bytes.Buffer
	l := New(&out, func() time.Time { return time.Unix(1700000000, 500_000_000) })
	if err := l.Emit("step", F("step", 3), F("loss", 0.25)); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%q: %v", out.String(), err)
	}
	if got["ts"] != 1700000000.5 || got["event"] != "step" || got["step"] != 3.0 || got["loss"] != 0.25 {
		t.Errorf("got %v", got)
	}
	var nilLog *Log
	if err := nilLog.Emit("x"); err != nil {
		t.Error(err)
	}
}
