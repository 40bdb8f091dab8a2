package catalog

import "testing"

func TestAddress(t *testing.T) {
	for _, tc := range []struct{ endpoint, want string }{
		{"http://10.0.0.5:8000", "10.0.0.5:8000"},
		{"http://10.0.0.5", "10.0.0.5:80"},
		{"https://worker.example", "worker.example:443"},
		{"grpcs://worker.example", "worker.example:443"},
		{"grpc://worker.example", "worker.example:80"},
		{"http://10.0.0.5:8000/v1", "10.0.0.5:8000"},
		{"http://[fd00::5]:8000", "[fd00::5]:8000"},
		{"http://[fd00::5]", "[fd00::5]:80"},
		{"10.0.0.5:8000", "10.0.0.5:8000"},
		{"worker-0:8000", "worker-0:8000"},
		{"[fd00::5]:8000", "[fd00::5]:8000"},
		{"[fd00::5]", "fd00::5"},
		{"fd00::5", "fd00::5"},
		{"10.0.0.5", "10.0.0.5"},
		{"10.0.0.5:", "10.0.0.5:"},
		{"http://", "http://"},
		{"", ""},
		{"https://w.example/v1", "w.example:443"},
		{"http://[fd00::1]:9000/x", "[fd00::1]:9000"},
		{"[::1]:8000", "[::1]:8000"},
		{"worker-3", "worker-3"},
		{"dyn://ns.component.ep", "ns.component.ep:80"},
		{"http://user@10.1.1.1:81/", "10.1.1.1:81"},
	} {
		if got := Address(tc.endpoint); got != tc.want {
			t.Errorf("Address(%q) = %q, want %q", tc.endpoint, got, tc.want)
		}
	}
}
