package httpadmin

import (
	_ "embed"
	"net/http"
	"strconv"
)

// openAPIDoc is the OpenAPI 3.0 description of every route in routes; the
// drift test (openapi_test.go) keeps the two equal.
//
//go:embed openapi.json
var openAPIDoc []byte

func (s *server) openAPI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(openAPIDoc)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openAPIDoc)
}
