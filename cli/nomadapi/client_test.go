package nomadapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestErrorsSayWhereAndWhatToCheck(t *testing.T) {
	forbidden := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Permission denied", http.StatusForbidden)
	}))
	defer forbidden.Close()

	cases := []struct {
		name, addr string
		want       []string
	}{
		{"unreachable", "http://127.0.0.1:1", []string{"cannot reach Nomad at http://127.0.0.1:1", "NOMAD_ADDR"}},
		{"unauthorised", forbidden.URL, []string{"refused the request", "NOMAD_TOKEN", forbidden.URL}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			api, err := New(Options{Address: c.addr})
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = api.Jobs(nil)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestOptionsOverrideTheEnvironment(t *testing.T) {
	t.Setenv("NOMAD_ADDR", "http://10.0.0.1:4646")
	api, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if api.Address() != "http://10.0.0.1:4646" {
		t.Errorf("NOMAD_ADDR not used: %s", api.Address())
	}
	api, _ = New(Options{Address: "http://127.0.0.1:5646"})
	if api.Address() != "http://127.0.0.1:5646" {
		t.Errorf("--address did not win: %s", api.Address())
	}
}
