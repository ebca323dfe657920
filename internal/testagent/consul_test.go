package testagent

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"
)

// TestConsulTellsItselfFromAnotherAgent: the start's probe accepts only the
// agent it started, so a port lost to another agent is retried, not used.
func TestConsulTellsItselfFromAnotherAgent(t *testing.T) {
	c, err := StartConsul("")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !c.isThisAgent(ctx) {
		t.Fatal("the started agent is not recognised as itself")
	}
	impostor := &Consul{Addr: c.Addr, serfLAN: c.serfLAN + 1}
	if impostor.isThisAgent(ctx) {
		t.Fatal("an agent gossiping on another port passed as ours")
	}
}

// TestConsulRetriesATakenPort: a start whose HTTP port another agent holds
// fails as errPortTaken (which startConsul retries on new ports).
func TestConsulRetriesATakenPort(t *testing.T) {
	c, err := StartConsul("")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	_, portStr, _ := net.SplitHostPort(c.Addr)
	port, _ := strconv.Atoi(portStr)
	// A process that keeps running while another agent answers on its
	// address: the situation of an agent whose HTTP port was taken and
	// which has not exited yet.
	other := &Consul{Addr: c.Addr, serfLAN: port + 7, dir: t.TempDir(),
		args: []string{"monitor", "-http-addr=" + c.Addr}}
	err = other.StartProcess()
	other.StopProcess()
	if !errors.Is(err, errPortTaken) {
		t.Fatalf("want errPortTaken, got %v", err)
	}
}
