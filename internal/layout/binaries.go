package layout

import "bytes"

// executableMagics are the first bytes of the compiled programs a Go build
// writes on each platform: ELF (Linux, BSD), Mach-O (macOS: 32- and 64-bit in
// both byte orders, and universal binaries) and PE (Windows, "MZ").
var executableMagics = [][]byte{
	{0x7f, 'E', 'L', 'F'},
	{0xfe, 0xed, 0xfa, 0xce}, {0xce, 0xfa, 0xed, 0xfe},
	{0xfe, 0xed, 0xfa, 0xcf}, {0xcf, 0xfa, 0xed, 0xfe},
	{0xca, 0xfe, 0xba, 0xbe},
	{'M', 'Z'},
}

// IsExecutable reports whether a file starting with head is a compiled
// program. The repository tracks none: every clone would download it, and a
// stale one is run by mistake.
func IsExecutable(head []byte) bool {
	for _, m := range executableMagics {
		if bytes.HasPrefix(head, m) {
			return true
		}
	}
	return false
}
