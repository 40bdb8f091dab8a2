package extproc

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/flow"
)

// FuzzFlowHeaders: any priority header is an integer within bounds or an
// error naming the header; any fairness id is accepted exactly when it is
// short printable UTF-8. Never a panic.
func FuzzFlowHeaders(f *testing.F) {
	for _, s := range []string{"0", "-1", " 7 ", "1000000", "-1000001", "1e3", "", "0x10", "９", "9223372036854775808", "+5"} {
		f.Add(s, "tenant-"+s)
	}
	f.Add("1", strings.Repeat("é", 200))
	f.Fuzz(func(t *testing.T, prio, tenant string) {
		p, err := parsePriority(prio)
		if err != nil {
			if !strings.Contains(err.Error(), HeaderPriority) {
				t.Fatalf("error without the header's name: %v", err)
			}
		} else {
			if p < flow.MinPriority || p > flow.MaxPriority {
				t.Fatalf("%q accepted as %d, out of range", prio, p)
			}
			if want, _ := strconv.Atoi(strings.TrimSpace(prio)); want != p {
				t.Fatalf("%q parsed as %d", prio, p)
			}
		}
		err = selection.CheckTenant(tenant)
		printable := utf8.ValidString(tenant) && !strings.ContainsFunc(tenant, func(r rune) bool { return r < 0x20 || r == 0x7f })
		if ok := len(tenant) <= flow.MaxTenantLen && printable; ok != (err == nil) {
			t.Fatalf("tenant %q: err %v", tenant, err)
		}
	})
}
