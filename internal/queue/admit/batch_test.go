package admit

import (
	"fmt"
	"testing"
	"time"
)

// With 500 jobs waiting, a change of every position is written in
// transactions of up to 64 operations (each with the leader check and a
// check-and-set per status), not one transaction per job; and every
// status is right.
func TestStatusWritesAreBatched(t *testing.T) {
	const n = 500
	f := newFixture(t, 1, 4)
	f.lead(f.c)
	f.submit(recordOf(jobOf("default", "big", "", 1, 4), 0, t0))
	for i := range n {
		f.submit(recordOf(jobOf("default", fmt.Sprintf("w%03d", i), "", 1, 1), 0, t0.Add(time.Duration(i+1)*time.Millisecond)))
	}
	batches := func(k int) int { return (k + maxTxnOps - 2) / (maxTxnOps - 1) }
	res := f.reconcile(f.c)
	// big: its intent and its admission; the 500 new statuses.
	if len(res.Admitted) != 1 || res.Transactions > 2+batches(n) {
		t.Fatalf("first round: %d admitted, %d transactions, want at most %d", len(res.Admitted), res.Transactions, 2+batches(n))
	}
	// Nothing changed: nothing written.
	if res := f.reconcile(f.c); res.Transactions != 0 {
		t.Fatalf("an idle round wrote %d transactions", res.Transactions)
	}
	// The head withdrawn: every other position moves up by one.
	if _, err := f.client.KV().Delete(JobKey(f.c.jobsPrefix(), "default", "w000"), nil); err != nil {
		t.Fatal(err)
	}
	res = f.reconcile(f.c)
	if max := 1 + batches(n-1); res.Transactions > max {
		t.Fatalf("a position change of %d jobs took %d transactions, want at most %d", n-1, res.Transactions, max)
	}
	t.Logf("%d waiting jobs moved up: %d transactions", n-1, res.Transactions)
	pairs, _, err := f.client.KV().List(f.c.statusPrefix()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(pairs) != n {
		t.Fatalf("%d statuses, want %d (big and %d waiting)", len(pairs), n, n-1)
	}
	for i := 1; i < n; i++ {
		st := f.status(fmt.Sprintf("default/w%03d", i))
		if st.State != StateQueued || st.Position != i || st.Reason == "" {
			t.Fatalf("w%03d: %+v, want queued at %d", i, st, i)
		}
	}
	if f.status("default/w000") != nil {
		t.Error("the withdrawn job's status is left")
	}
}
