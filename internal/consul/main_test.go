package consul

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/testagent"
)

// consulAddr is the test agent's HTTP address ("" in -short).
var consulAddr string

func TestMain(m *testing.M) {
	// TTLs from 1s, so that sessions in these tests expire quickly.
	os.Exit(testagent.Main(m, `session_ttl_min = "1s"`, func(a *testagent.Consul) error {
		consulAddr = a.Addr
		return nil
	}))
}

func newClient(t *testing.T) *api.Client {
	t.Helper()
	if consulAddr == "" {
		t.Skip("needs a Consul agent (not with -short)")
	}
	c, err := api.NewClient(&api.Config{Address: consulAddr})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testCtx is a context that ends with the test, bounded so that a hang
// fails instead of running into go test's timeout.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newSession makes a session that the test closes when it ends.
func newSession(t *testing.T, c *api.Client, opts SessionOptions) *Session {
	t.Helper()
	if opts.Name == "" {
		opts.Name = t.Name()
	}
	if opts.TTL == 0 {
		opts.TTL = 2 * time.Second
	}
	opts.Logf = t.Logf
	s, err := NewSession(testCtx(t), c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

// closedWithin reports whether ch closes (or delivers) within limit.
func closedWithin[T any](ch <-chan T, limit time.Duration) bool {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// uniqueKey is a key of this test's own.
func uniqueKey(t *testing.T) string {
	return fmt.Sprintf("gpujob-test/%s/%d", t.Name(), time.Now().UnixNano())
}
