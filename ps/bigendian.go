//go:build armbe || arm64be || m68k || mips || mips64 || mips64p32 || ppc || ppc64 || s390 || s390x || shbe || sparc || sparc64

package ps

// The data plane views frame bodies as little-endian keys and floats in
// place; a big-endian machine would need byte swaps it does not do.
var _ = "package ps needs a little-endian machine" + 1
