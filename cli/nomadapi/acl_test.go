package nomadapi

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// nomadAnswering is a Nomad stand-in that answers every request with status
// and body, as Nomad's HTTP layer words its ACL refusals.
func nomadAnswering(t *testing.T, status int, body string) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, body, status)
	}))
	t.Cleanup(s.Close)
	return s
}

func TestRefusalsNameTheMissingRule(t *testing.T) {
	t.Setenv("NOMAD_TOKEN", "")
	t.Setenv("NOMAD_NAMESPACE", "")
	denied := nomadAnswering(t, http.StatusForbidden, "Permission denied")
	cases := []struct {
		name string
		call func(API) error
		need Need
		want string
	}{
		{"register", func(a API) error { _, err := a.Register(api.NewBatchJob("j", "j", "global", 50)); return err },
			Need{Namespace: "team-a", Capability: CapSubmitJob}, `this needs the submit-job capability in namespace "team-a"`},
		{"parse", func(a API) error { _, err := a.ParseHCL(`job "j" {}`, ""); return err },
			Need{Namespace: "team-a", Capability: CapSubmitJob}, "submit-job"},
		{"job", func(a API) error { _, err := a.Job("j"); return err },
			Need{Namespace: "team-a", Capability: CapReadJob}, "read-job"},
		{"list", func(a API) error { _, _, err := a.Jobs(nil); return err },
			Need{Namespace: "team-a", Capability: CapListJobs}, "list-jobs"},
		{"nodes", func(a API) error { _, _, err := a.Nodes(nil); return err },
			Need{Node: "read"}, "this needs node read"},
		{"node stats", func(a API) error { _, err := a.NodeStats("n1"); return err },
			Need{Node: "read"}, "this needs node read"},
		{"logs", func(a API) error {
			cancel := make(chan struct{})
			defer close(cancel)
			_, errs := a.Logs(&api.Allocation{ID: "a1", Name: "j.train[0]", NodeID: "n1"}, "train", "stdout", false, cancel)
			return <-errs
		}, Need{Namespace: "team-a", Capability: CapReadLogs}, "read-logs"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, err := New(Options{Address: denied.URL, Namespace: "team-a"})
			if err != nil {
				t.Fatal(err)
			}
			err = c.call(a)
			var pe *PermissionError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v (%T) is not a PermissionError", err, err)
			}
			if pe.Need != c.need || pe.Problem != TokenDenied || pe.TokenSet {
				t.Errorf("got need %+v problem %v token set %v, want %+v, denied, no token", pe.Need, pe.Problem, pe.TokenSet, c.need)
			}
			for _, w := range []string{"permission denied: ", c.want, denied.URL, "NOMAD_TOKEN is not set", "set NOMAD_TOKEN to a token whose policy grants it"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
		})
	}
}

func TestUnusableTokensAreToldApart(t *testing.T) {
	cases := []struct {
		name, body string
		status     int
		problem    TokenProblem
		want       string
	}{
		// A forged or revoked secret: Nomad's 403 names no capability.
		{"unknown", "ACL token not found", http.StatusForbidden, TokenNotFound, "does not know the ACL token"},
		// Nomad answers an expired token with a 500.
		{"expired", "failed to resolve ACL token: ACL token expired", http.StatusInternalServerError, TokenExpired, "the ACL token expired"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := nomadAnswering(t, c.status, c.body)
			a, err := New(Options{Address: srv.URL, Token: "8a4bd0f5-3c0e-4c5e-9d51-2b1e0d7f6a11"})
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = a.Nodes(nil)
			var pe *PermissionError
			if !errors.As(err, &pe) || pe.Problem != c.problem || !pe.TokenSet {
				t.Fatalf("error %v: want a PermissionError with problem %v and a token", err, c.problem)
			}
			msg := err.Error()
			for _, w := range []string{c.want, srv.URL, "NOMAD_TOKEN"} {
				if !strings.Contains(msg, w) {
					t.Errorf("%q lacks %q", msg, w)
				}
			}
			if strings.Contains(msg, "8a4bd0f5") {
				t.Errorf("the error shows the token's secret: %q", msg)
			}
		})
	}
}

// Most endpoints answer "Permission denied" to a forged or expired token as
// to one that lacks a capability; the token's own /v1/acl/token/self tells
// them apart.
func TestRefusedTokensAreDiagnosed(t *testing.T) {
	past := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	cases := []struct {
		name       string
		selfStatus int
		selfBody   string
		problem    TokenProblem
		want       []string
	}{
		{"forged", http.StatusNotFound, "ACL token not found", TokenNotFound,
			[]string{"does not know the ACL token", "mistyped, revoked or from another cluster"}},
		{"expired", http.StatusOK, `{"Name":"ci","Policies":["gpujob-submit"],"ExpirationTime":"` + past.Format(time.RFC3339) + `","SecretID":"8a4bd0f5-3c0e-4c5e-9d51-2b1e0d7f6a11"}`,
			TokenExpired, []string{`the ACL token "ci" (policies gpujob-submit) expired at ` + past.Format(time.RFC3339), "new token"}},
		{"expired, resolved", http.StatusInternalServerError, "failed to resolve ACL token: ACL token expired", TokenExpired,
			[]string{"the ACL token expired", "new token"}},
		{"valid but lacking", http.StatusOK, `{"Name":"viewer","Policies":["gpujob-readonly"],"SecretID":"8a4bd0f5-3c0e-4c5e-9d51-2b1e0d7f6a11"}`,
			TokenDenied, []string{`this needs the submit-job capability in namespace "default"`, `to the token "viewer" (policies gpujob-readonly)`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.HandleFunc("/v1/acl/token/self", func(w http.ResponseWriter, r *http.Request) {
				if c.selfStatus == http.StatusOK {
					w.Header().Set("Content-Type", "application/json")
					_, _ = w.Write([]byte(c.selfBody))
					return
				}
				http.Error(w, c.selfBody, c.selfStatus)
			})
			mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "Permission denied", http.StatusForbidden)
			})
			srv := httptest.NewServer(mux)
			defer srv.Close()
			a, err := New(Options{Address: srv.URL, Token: "8a4bd0f5-3c0e-4c5e-9d51-2b1e0d7f6a11", Namespace: "default"})
			if err != nil {
				t.Fatal(err)
			}
			_, err = a.Plan(api.NewBatchJob("j", "j", "global", 50))
			var pe *PermissionError
			if !errors.As(err, &pe) || pe.Problem != c.problem {
				t.Fatalf("error %v: want a PermissionError with problem %v", err, c.problem)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "8a4bd0f5") {
				t.Errorf("the error shows the token's secret: %q", err)
			}
		})
	}
}

func TestOtherFailuresAreNotPermissionErrors(t *testing.T) {
	for _, c := range []struct {
		status int
		body   string
	}{
		{http.StatusInternalServerError, "rpc error: No cluster leader"},
		{http.StatusNotFound, "job not found"},
	} {
		srv := nomadAnswering(t, c.status, c.body)
		a, _ := New(Options{Address: srv.URL})
		_, err := a.Job("j")
		var pe *PermissionError
		if err == nil || errors.As(err, &pe) {
			t.Errorf("%d %q: got %v, want a plain error", c.status, c.body, err)
		}
	}
}

func TestForCommandNamesTheWholePolicy(t *testing.T) {
	refused := &PermissionError{Op: "listing nodes", Need: Need{Node: "read"}, Address: "https://127.0.0.1:4646"}
	err := ForCommand("submit", refused)
	want := `permission denied: this needs node read (Nomad at https://127.0.0.1:4646 refused listing nodes to the anonymous token: NOMAD_TOKEN is not set); ` +
		`gpujob submit needs the submit-job, read-job and read-logs capabilities in namespace "default" and node read; ` +
		`set NOMAD_TOKEN to a token whose policy grants them`
	if err.Error() != want {
		t.Errorf("got\n%s\nwant\n%s", err, want)
	}

	// The namespace of the refused request is the one the command works in.
	err = ForCommand("status", &PermissionError{Op: "reading job j", Need: Need{Namespace: "ml", Capability: CapReadJob}, TokenSet: true})
	if !strings.Contains(err.Error(), `gpujob status needs the read-job and read-logs capabilities in namespace "ml"`) ||
		strings.Contains(err.Error(), "anonymous") {
		t.Errorf("got %q", err)
	}

	// A command that needs exactly the refused rule is not told twice.
	err = ForCommand("list", &PermissionError{Op: "listing jobs", Need: Need{Namespace: "default", Capability: CapListJobs}, TokenSet: true})
	if strings.Contains(err.Error(), "gpujob list needs") || !strings.Contains(err.Error(), "grants it") {
		t.Errorf("got %q", err)
	}

	// Other errors, and commands that need nothing of Nomad, pass as they are.
	plain := errors.New("boom")
	if ForCommand("submit", plain) != plain {
		t.Error("a plain error was changed")
	}
	if err := ForCommand("validate", &PermissionError{Op: "x", Need: Need{Node: "read"}}); strings.Contains(err.Error(), "gpujob validate needs") {
		t.Errorf("got %q", err)
	}
}
