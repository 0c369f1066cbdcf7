package netaddr

import (
	"strings"
	"testing"
)

func TestCheckAndAdvertised(t *testing.T) {
	tests := []struct {
		bind, advertise string
		err             string // "" : accepted
		port            int
		want            string // Advertised
	}{
		{"127.0.0.1:0", "", "", 7011, ""},
		{"0.0.0.0:7011", "", "pass --advertise HOST", 0, ""},
		{"[::]:0", "", "pass --advertise HOST", 0, ""},
		{":0", "", "pass --advertise HOST", 0, ""},
		{"0.0.0.0:0", "10.0.0.5", "", 7011, "10.0.0.5:7011"},
		{"[::]:0", "::1", "", 7011, "[::1]:7011"},
		{"[::]:0", "[fd00::2]", "", 7011, "[fd00::2]:7011"},
		{"127.0.0.1:0", "10.1.2.3:7071", "", 7011, "10.1.2.3:7071"},
		{"0.0.0.0:0", "0.0.0.0", "names no host peers can dial", 0, ""},
		{"0.0.0.0:0", "[::]:7", "names no host peers can dial", 0, ""},
		{"nohost", "", "bind address", 0, ""},
	}
	for _, tc := range tests {
		err := Check(tc.bind, tc.advertise)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Check(%q, %q): %v, want an error saying %q", tc.bind, tc.advertise, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("Check(%q, %q): %v", tc.bind, tc.advertise, err)
		}
		if got := Advertised(tc.advertise, tc.port); got != tc.want {
			t.Errorf("Advertised(%q, %d) = %q, want %q", tc.advertise, tc.port, got, tc.want)
		}
	}
}
