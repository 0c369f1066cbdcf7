package bytesize

import "testing"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"4096", 4096, true}, {"4KiB", 4096, true}, {"16MiB", 16 << 20, true}, {"1GiB", 1 << 30, true}, {"64K", 64 << 10, true},
		{"12B", 12, true}, {"huge", 0, false}, {"-1", 0, false}, {"", 0, false},
	} {
		got, err := Parse(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("Parse(%q) = %d, %v; want %d (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestParseList(t *testing.T) {
	if got, err := ParseList("4KiB,1MiB", 4); err != nil || len(got) != 2 || got[1] != 1<<20 {
		t.Errorf("ParseList = %v, %v", got, err)
	}
	if _, err := ParseList("6", 4); err == nil {
		t.Error("6 bytes of 4-byte elements accepted")
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{12: "12 B", 2048: "2.0 KiB", 3 << 20: "3.0 MiB", 5 << 30: "5.00 GiB"} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}
