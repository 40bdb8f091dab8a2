package httpadmin

import (
	"encoding/json"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// TestOpenAPIMatchesRoutes is the drift test: every route registered in the
// mux is documented with its method, every documented operation is routed to
// exactly that pattern, and the path parameters agree.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openAPIDoc, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.0.") {
		t.Fatalf("openapi = %q, want 3.0.x", doc.OpenAPI)
	}
	documented := map[string]bool{}
	for p, ops := range doc.Paths {
		for m, raw := range ops {
			if !slices.Contains(httpMethods, m) {
				continue // "parameters", "summary", ...
			}
			documented[strings.ToUpper(m)+" "+p] = true
			var op struct {
				Parameters []struct{ Name, In string } `json:"parameters"`
				Responses  map[string]json.RawMessage  `json:"responses"`
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("%s %s: %v", m, p, err)
			}
			if len(op.Responses) == 0 {
				t.Errorf("%s %s documents no responses", m, p)
			}
			var inPath, declared []string
			for _, x := range regexp.MustCompile(`\{([^}]+)\}`).FindAllStringSubmatch(p, -1) {
				inPath = append(inPath, x[1])
			}
			for _, prm := range op.Parameters {
				if prm.In == "path" {
					declared = append(declared, prm.Name)
				}
			}
			if !slices.Equal(inPath, declared) {
				t.Errorf("%s %s: path parameters %v, declared %v", m, p, inPath, declared)
			}
		}
	}
	registered := map[string]bool{}
	for _, rt := range routes {
		registered[rt.method+" "+rt.pattern] = true
		if !documented[rt.method+" "+rt.pattern] {
			t.Errorf("route %s %s is not in openapi.json", rt.method, rt.pattern)
		}
	}
	s := New(newService(t, nil), Options{}).(*server)
	sample := regexp.MustCompile(`\{[^}]+\}`)
	for op := range documented {
		if !registered[op] {
			t.Errorf("openapi.json documents %s, which is not registered", op)
		}
		method, p, _ := strings.Cut(op, " ")
		req := httptest.NewRequest(method, sample.ReplaceAllString(p, "7"), nil)
		if _, pattern := s.mux.Handler(req); pattern != op {
			t.Errorf("%s is routed to %q", op, pattern)
		}
	}
}
