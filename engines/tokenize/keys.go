package tokenize

import (
	"bytes"
	"encoding/binary"

	"github.com/zeebo/xxh3"

	"github.com/kvselect/kvselect/selection"
)

// reqKeys are a request's cache keys.
type reqKeys struct {
	full key // the whole request
	chat bool
	// tmpl names the chat template: the model and every option except
	// add_generation_prompt (and continue_final_message, which only changes
	// the last message).
	tmpl key
	// prefixes[i] names messages[:i+1] rendered under tmpl without a
	// generation prompt.
	prefixes []key
	gen      bool // add_generation_prompt (vLLM's default: true)
	cont     bool // continue_final_message
}

// Domain tags keep the key spaces apart.
const (
	tagPrompt byte = iota + 1
	tagChat
	tagTemplate
	tagPrefix
)

func keysOf(req *selection.TokenizeRequest) reqKeys {
	var rk reqKeys
	h := xxh3.New128()
	var n [8]byte
	writeBytes := func(b []byte) {
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		_, _ = h.Write(n[:])
		_, _ = h.Write(b)
	}
	writeString := func(s string) {
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		_, _ = h.Write(n[:])
		_, _ = h.WriteString(s)
	}
	options := func(skip func(string) bool) {
		for _, o := range req.Options {
			if skip(o.Name) {
				continue
			}
			writeString(o.Name)
			writeBytes(o.Value)
		}
	}
	if req.Messages == nil {
		_, _ = h.Write([]byte{tagPrompt})
		writeString(req.ModelName)
		options(func(string) bool { return false })
		writeString(req.Prompt)
		rk.full = h.Sum128()
		return rk
	}
	rk.chat, rk.gen = true, true
	for _, o := range req.Options {
		v := bytes.TrimSpace(o.Value)
		switch o.Name {
		case "add_generation_prompt":
			rk.gen = !bytes.Equal(v, []byte("false"))
		case "continue_final_message":
			rk.cont = bytes.Equal(v, []byte("true"))
		}
	}
	_, _ = h.Write([]byte{tagTemplate})
	writeString(req.ModelName)
	options(func(name string) bool { return name == "add_generation_prompt" || name == "continue_final_message" })
	rk.tmpl = h.Sum128()
	rk.prefixes = make([]key, len(req.Messages))
	prev := rk.tmpl
	var pb [17]byte
	for i, m := range req.Messages {
		h.Reset()
		pb[0] = tagPrefix
		b := prev.Bytes()
		copy(pb[1:], b[:])
		_, _ = h.Write(pb[:])
		writeBytes(m)
		prev = h.Sum128()
		rk.prefixes[i] = prev
	}
	h.Reset()
	_, _ = h.Write([]byte{tagChat})
	b := prev.Bytes()
	_, _ = h.Write(b[:])
	binary.LittleEndian.PutUint64(n[:], uint64(len(req.Messages)))
	_, _ = h.Write(n[:])
	options(func(string) bool { return false })
	rk.full = h.Sum128()
	return rk
}
