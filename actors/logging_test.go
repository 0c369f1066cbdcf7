package actors

import (
	"log/slog"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestProtoactorLogLines: a peer's connection ending (a worker leaving)
// is logged at info, and no protoactor line carries a stack trace; other
// errors stay errors.
func TestProtoactorLogLines(t *testing.T) {
	cases := []struct {
		name     string
		level    zapcore.Level // the process's logger's
		msg      string
		want     zapcore.Level
		recorded bool
	}{
		{"peer ended", zapcore.InfoLevel, "EndpointWriter lost connection", zapcore.InfoLevel, true},
		{"peer ended, logger at warn", zapcore.WarnLevel, "EndpointWriter lost connection", 0, false},
		{"another error", zapcore.WarnLevel, "EndpointWriter got invalid connect response", zapcore.ErrorLevel, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(tc.level)
			sys, err := NewSystem(Options{Logger: zap.New(core)})
			if err != nil {
				t.Fatal(err)
			}
			sys.Logger().Error(tc.msg, slog.String("address", "127.0.0.1:1"))
			got := logs.FilterMessage(tc.msg).All()
			if !tc.recorded {
				if len(got) != 0 {
					t.Fatalf("logged %v at a logger level of %v, want nothing", got, tc.level)
				}
				return
			}
			if len(got) != 1 || got[0].Level != tc.want || got[0].Stack != "" {
				t.Fatalf("logged %+v, want one line at %v without a stack trace", got, tc.want)
			}
		})
	}
}
