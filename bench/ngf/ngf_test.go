package ngf

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Conf rewrites the example's folder, listener and picker port, and keeps
// NGINX in the foreground as its starter's child.
func TestConfRewritesTheExample(t *testing.T) {
	dir := t.TempDir()
	example := "load_module " + NJSModule + ";\npid /PATH/TO/run/nginx.pid;\njs_path /PATH/TO/ngf-epp-shim;\n" +
		"listen 127.0.0.1:8080;\nset $epp_port 9002;\n"
	if err := os.WriteFile(filepath.Join(dir, "nginx.example.conf"), []byte(example), 0o644); err != nil {
		t.Fatal(err)
	}
	conf, err := Conf(dir, "/run/x", 18080, "19002")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"daemon off;", "master_process off;", "pid /run/x/nginx.pid;", "js_path " + dir + ";",
		"listen 127.0.0.1:18080;", "set $epp_port 19002;"} {
		if !strings.Contains(string(conf), want) {
			t.Errorf("configuration lacks %q:\n%s", want, conf)
		}
	}
	// An example that changed shape is an error, not a silently wrong run.
	if err := os.WriteFile(filepath.Join(dir, "nginx.example.conf"), []byte("listen 80;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Conf(dir, "/run/x", 18080, "19002"); err == nil {
		t.Fatal("no error for an example without the expected lines")
	}
}

// Without a folder, Check says what to set.
func TestCheckNamesTheFix(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		err := Check(dir)
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), EnvShimDir) {
			t.Errorf("Check(%q) = %v, want ErrUnavailable naming %s", dir, err, EnvShimDir)
		}
	}
}
