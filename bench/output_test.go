package bench

import (
	"encoding/json"
	"testing"
)

// TestBenchJSONFields pins the JSON lines' field names and order: the
// scripts under bench/ and the docs read them.
func TestBenchJSONFields(t *testing.T) {
	cases := []struct {
		v    any
		want string
	}{
		{AllReduceResult{}, `{"op":"","ranks":0,"bytes":0,"algo":"","algorithm":"","transport":"","iters":0,"median_s":0,"algbw_GBps":0,"busbw_GBps":0}`},
		{TCPResult{}, `{"op":"","bytes":0,"seconds":0,"GBps":0}`},
		{PSResult{}, `{"op":"","workers":0,"shards":0,"replicas":0,"keys_per_request":0,"dim":0,"row_bytes":0,"seconds":0,` +
			`"GBps":0,"raw_tcp_GBps":0,"ratio":0,"requests":0,"median_pushpull_ms":0}`},
		{CheckpointResult{}, `{"bytes":0,"ranks":0,"plain_put_s":0,"save_s":0,"upload_ratio":0,"memcpy_s":0,"stall_s":0,` +
			`"stall_memcpy":0,"plain_get_s":0,"restore_s":0,"restore_ratio":0}`},
	}
	for _, tc := range cases {
		b, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tc.want {
			t.Errorf("%T:\n got %s\nwant %s", tc.v, b, tc.want)
		}
	}
}

func TestBenchMedian(t *testing.T) {
	cases := []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
	}
	for _, tc := range cases {
		in := append([]float64(nil), tc.in...)
		if got := median(in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
		for i := range in {
			if in[i] != tc.in[i] {
				t.Errorf("median(%v) reordered its argument", tc.in)
			}
		}
	}
}
