package servekv

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestKeysRoundTrip(t *testing.T) {
	for _, tc := range []struct{ ns, svc string }{
		{"default", "bert-clf"},
		{"team-a", "x"},
		{"default", "../../etc"},
		{"default", "a/b"},
	} {
		ns, svc, ok := ParseRouteKey(DefaultPrefix, RouteKey(DefaultPrefix, tc.ns, tc.svc))
		if !ok || ns != tc.ns || svc != tc.svc {
			t.Errorf("route key of %q/%q parsed as %q/%q ok=%v", tc.ns, tc.svc, ns, svc, ok)
		}
		if strings.Count(strings.TrimPrefix(RouteKey(DefaultPrefix, tc.ns, tc.svc), DefaultPrefix+"/"), "/") != 2 {
			t.Errorf("route key %q of %q/%q is not 3 segments", RouteKey(DefaultPrefix, tc.ns, tc.svc), tc.ns, tc.svc)
		}
		_, hash, _, err := NewSecret()
		if err != nil {
			t.Fatal(err)
		}
		ns, svc, h, ok := ParseTokenKey(DefaultPrefix, TokenKey(DefaultPrefix, tc.ns, tc.svc, hash))
		if !ok || ns != tc.ns || svc != tc.svc || h != hash {
			t.Errorf("token key parsed as %q/%q/%q ok=%v", ns, svc, h, ok)
		}
	}
	for _, k := range []string{
		DefaultPrefix + "/default/svc",
		DefaultPrefix + "/default/svc/route/x",
		DefaultPrefix + "/default/svc/tokens/abc",
		DefaultPrefix + "/default/svc/tokens/" + strings.Repeat("A", 64),
		"other/default/svc/route",
		LeaderKey(DefaultPrefix + "/x"),
		LoadKey(DefaultPrefix+"/x", "gw1"),
	} {
		if _, _, ok := ParseRouteKey(DefaultPrefix, k); ok {
			t.Errorf("%q parsed as a route key", k)
		}
		if _, _, _, ok := ParseTokenKey(DefaultPrefix, k); ok {
			t.Errorf("%q parsed as a token key", k)
		}
	}
}

func TestSecrets(t *testing.T) {
	s1, h1, id1, err := NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	s2, h2, _, _ := NewSecret()
	if s1 == s2 || h1 == h2 {
		t.Fatal("two secrets are equal")
	}
	if !strings.HasPrefix(s1, SecretPrefix) || len(s1) < 40 {
		t.Errorf("secret %q: want %s and 256 bits", s1, SecretPrefix)
	}
	if HashSecret(s1) != h1 || !validHash(h1) || id1 != h1[:12] {
		t.Errorf("hash %q id %q of %q", h1, id1, s1)
	}
	if strings.Contains(h1, s1) || !SameHash(h1, HashSecret(s1)) || SameHash(h1, h2) {
		t.Error("hash comparison")
	}
}

func TestRouteJSON(t *testing.T) {
	r := Route{Namespace: "default", Service: "s", Timeout: Duration(1500 * time.Millisecond),
		Autoscale: &Autoscale{Min: 0, Max: 3, TargetInflight: 2, ScaleDownDelay: Duration(5 * time.Minute)}}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"timeout":"1.5s"`) || !strings.Contains(string(b), `"scale_down_delay":"5m0s"`) {
		t.Errorf("json %s", b)
	}
	var back Route
	if err := json.Unmarshal(b, &back); err != nil || back.Timeout.Std() != 1500*time.Millisecond || back.Autoscale.ScaleDownDelay.Std() != 5*time.Minute {
		t.Errorf("round trip %+v %v", back, err)
	}
	if err := json.Unmarshal([]byte(`{"timeout":"soon"}`), &back); err == nil {
		t.Error("bad duration accepted")
	}
}
