package gateway

import (
	"net/url"
	"testing"

	"github.com/gpujob/gpujob/internal/servekv"
)

// A route deployed later, in another namespace say, never takes over a
// host and prefix that another route had first.
func TestDropConflictsKeepsTheOlderRoute(t *testing.T) {
	entry := func(key, host, prefix string, created uint64) *routeEntry {
		return &routeEntry{route: &servekv.Route{PathPrefix: prefix, Host: host}, prefix: prefix, host: host,
			svc: &service{key: key}, created: created}
	}
	prod := entry("prod/bert", "", "/bert", 10)
	hijack := entry("a-team/bert", "", "/bert", 20) // sorts first, came later
	other := entry("a-team/x", "", "/x", 5)
	hosted := entry("b/bert", "bert.example.com", "/bert", 30)
	kept, lost := dropConflicts([]*routeEntry{hijack, prod, other, hosted})
	if len(kept) != 3 || len(lost) != 1 || lost[0].lost != hijack || lost[0].kept != prod {
		t.Fatalf("kept %d, lost %+v", len(kept), lost)
	}
	tbl := newTable(kept)
	if e := tbl.match("gw", "/bert/predict"); e == nil || e.svc.key != "prod/bert" {
		t.Errorf("/bert routes to %v, want prod/bert", e)
	}
	if e := tbl.match("bert.example.com", "/bert/predict"); e == nil || e.svc.key != "b/bert" {
		t.Errorf("the hosted route lost to the hostless one")
	}
}

func TestStripPrefixAlwaysGivesAPath(t *testing.T) {
	for _, c := range []struct{ in, path, raw string }{
		{"/svc/predict", "/predict", ""},
		{"/svc", "/", ""},
		{"/svc/a%2Fb", "/a/b", "/a%2Fb"},
		{"/svc%2Fx", "/x", ""},
	} {
		u, err := url.Parse("http://gw" + c.in)
		if err != nil {
			t.Fatal(err)
		}
		path, raw := stripPrefix("/svc", u)
		if path != c.path || raw != c.raw {
			t.Errorf("%s: got %q %q, want %q %q", c.in, path, raw, c.path, c.raw)
		}
	}
}
