package sweepjob

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
	"github.com/gpujob/gpujob/internal/testagent"
)

func startConsul(t *testing.T) *consul.Client {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a Consul agent (-short)")
	}
	a, err := testagent.StartConsul("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	c, err := consul.NewClient(&consul.Config{Address: a.Addr})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Submit records a sweep once; credentials that cannot be made leave no
// record behind, so the same submission can be retried.
func TestSubmit(t *testing.T) {
	c := startConsul(t)
	ctx := context.Background()
	const prefix = "gpujob/sweeps"
	rec := record("sw")
	now := time.Unix(1700000000, 0)
	keys := func() []string {
		ks, _, err := c.KV().Keys(sweepkv.SweepKey(prefix, rec.Namespace, rec.Sweep)+"/", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		return ks
	}

	denied := errors.New("the token cannot make the controller's tokens")
	if err := Submit(ctx, c, prefix, rec, InitialState(rec, 2, now), func() error { return denied }); !errors.Is(err, denied) {
		t.Fatalf("credentials refused: %v, want %v", err, denied)
	}
	if ks := keys(); len(ks) != 0 {
		t.Fatalf("a refused submission left %v", ks)
	}

	issued := 0
	if err := Submit(ctx, c, prefix, rec, InitialState(rec, 2, now), func() error { issued++; return nil }); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if issued != 1 || len(keys()) != 2 {
		t.Fatalf("after a submission: %d issues, keys %v; want 1 issue, the record and the state", issued, keys())
	}

	// A second submission of the name is refused before it makes
	// credentials, and leaves the winner's record alone.
	err := Submit(ctx, c, prefix, rec, InitialState(rec, 2, now), func() error { issued++; return nil })
	if err == nil || !strings.Contains(err.Error(), "another submission") || issued != 1 {
		t.Fatalf("a second submission: %v (%d issues), want a refusal before issuing", err, issued)
	}
	if len(keys()) != 2 {
		t.Fatalf("the refused submission touched the record: %v", keys())
	}
}
