package supervisor

import (
	"bytes"
	"testing"
)

// The throttling itself is errlog.Throttled's (tested there); this is the
// supervisor's line format.
func TestConsulLogPrefixesItsLines(t *testing.T) {
	var out bytes.Buffer
	logf := consulLog(&out)
	logf("renew: %s", "connection refused")
	logf("held back") // within consulLogEvery
	if got, want := out.String(), "gpujob: consul: renew: connection refused\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
