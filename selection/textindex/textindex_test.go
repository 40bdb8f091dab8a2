package textindex

import (
	"strings"
	"testing"
)

func TestBlockHashesCutFixedCharacterBlocks(t *testing.T) {
	text := strings.Repeat("abcdefghijklmnop", 3) + "xyz" // 51 bytes, block size 4 → 16-byte blocks
	locals, isl := BlockHashes(text, 4, "", "")
	if len(locals) != 3 || isl != 13 {
		t.Fatalf("got %d blocks, isl %d; want 3 blocks (tail not hashed), isl ceil(51/4)=13", len(locals), isl)
	}
	if locals[0] != locals[1] || locals[1] != locals[2] {
		t.Fatal("equal blocks must hash equal (the chain, not the block hash, carries position)")
	}
	salted, _ := BlockHashes(text, 4, "", "tenant-a")
	lora, _ := BlockHashes(text, 4, "adapter", "")
	if salted[0] == locals[0] || lora[0] == locals[0] || salted[0] == lora[0] {
		t.Fatal("cache salt and LoRA name must change the text hashes")
	}
	if _, isl := BlockHashes("a", 4, "", ""); isl != 1 {
		t.Fatalf("a one-byte prompt is one token, got %d", isl)
	}
}
