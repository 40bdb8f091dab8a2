package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestSideBySideAgreesAndPrintsRatio(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run([]string{"-max", "400", "-workers", "4", "-blocks", "256", "-runs", "1"}, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{"both indexes agree", "kvselect vs llm-d/chained", "event apply ns/block"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
}
