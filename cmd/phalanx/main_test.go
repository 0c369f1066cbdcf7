package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestUsageErrors: a bad command line is a usage error (exit 2) that names
// the flag and the problem, before anything starts.
func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"train", "--workers", "0"}, "--workers 0"},
		{[]string{"train", "--example", "gpt"}, "--example gpt"},
		{[]string{"train", "--steps", "0"}, "--steps 0"},
		{[]string{"train", "--lr", "-1"}, "learning rate"},
		{[]string{"train", "--optimizer", "lion"}, "unknown optimizer"},
		{[]string{"train", "--schedule", "exp"}, "unknown schedule"},
		{[]string{"train", "--hidden", "512,x"}, "option hidden"},
		{[]string{"train", "--hidden", "3", "--example", "sparse-lr"}, "no such option"},
		{[]string{"train", "--data", "/nonexistent/mnist"}, "train-images-idx3-ubyte"},
		{[]string{"train", "--bucket", "lots"}, "--bucket"},
		{[]string{"train", "--sync", "asp"}, "--sync asp"},
		{[]string{"train", "--quorum", "2", "--sync", "hybrid"}, "--sync"},
		{[]string{"train", "--checkpoint-every-steps", "5"}, "--checkpoint"},
		{[]string{"train", "--fail-at", "9:3", "--workers", "2"}, "--fail-at 9"},
		{[]string{"train", "--example", "sparse-lr", "--ps-replicas", "2"}, "--ps-replicas 2"},
		{[]string{"worker", "--job", "j"}, "--etcd-endpoints"},
		{[]string{"stop"}, "--etcd-endpoints and --job"},
	}
	for _, tc := range cases {
		var out, errOut bytes.Buffer
		err := runCommand(t, tc.args, &out, &errOut)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want a usage error mentioning %q", tc.args, err, tc.want)
		}
	}
}
