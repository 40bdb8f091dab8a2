package httpadmin

import (
	"errors"
	"net/http"

	"github.com/kvselect/kvselect/internal/access"
)

// authRealm names the protection space in challenges (RFC 7235 section 2.2).
const authRealm = "kvselect"

// authorize runs the Authorizer for a route that needs scope and, when it
// refuses, answers: 401 with a Bearer challenge when the request has no
// usable credentials, 403 with error="insufficient_scope" when it has but
// they lack the scope (RFC 6750 section 3.1), both in the {"error"}
// envelope. Open routes (scope 0) pass. Admin requests that pass are logged
// with who made them: they change where prompts go.
func (s *server) authorize(w http.ResponseWriter, r *http.Request, scope access.Scope) bool {
	if scope == 0 {
		return true
	}
	id, err := s.auth.Authorize(r.Context(), r, scope)
	if err == nil {
		if scope == access.Admin {
			s.log.Info("httpadmin: admin request", "method", r.Method, "path", r.URL.Path, "identity", id.String(), "remote", r.RemoteAddr)
		}
		return true
	}
	challenge := `Bearer realm="` + authRealm + `"`
	status := http.StatusUnauthorized
	switch {
	case errors.Is(err, access.ErrForbidden):
		status = http.StatusForbidden
		challenge += `, error="insufficient_scope", scope="` + scope.String() + `"`
	case errors.Is(err, access.ErrInvalidCredentials):
		challenge += `, error="invalid_token"`
	}
	w.Header().Set("WWW-Authenticate", challenge)
	refuseUnread(w, r, status, err.Error())
	return false
}
