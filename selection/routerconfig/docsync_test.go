package routerconfig

import (
	"os"
	"strings"
	"testing"
)

// TestConfigurationDocIsCurrent keeps docs/configuration.md in step with
// EnvTable: the documented table must be exactly what EnvMarkdown renders.
func TestConfigurationDocIsCurrent(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), EnvMarkdown()) {
		t.Fatal("docs/configuration.md is out of date: regenerate its table from routerconfig.EnvMarkdown()")
	}
}
