package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	_ "net/http/pprof" // the gateway child's profile endpoint (its own listener)
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	gw "github.com/gpujob/gpujob/internal/gateway"
	"github.com/gpujob/gpujob/internal/servekv"
)

// replicaState is what a replica records of the requests it receives, for
// the pool test: when the last one arrived and when the first one since the
// last reset did (unix nanoseconds; the same clock as the parent's).
type replicaState struct {
	name       string
	count      atomic.Int64
	last       atomic.Int64
	firstAfter atomic.Int64 // 0 = none since the reset
}

// arrivals is the control endpoint's answer, per replica.
type arrivals struct {
	Count      int64 `json:"count"`
	Last       int64 `json:"last"`
	FirstAfter int64 `json:"first_after"`
}

// runBackendRole serves the replicas, one listener and http.Server each,
// and a control listener; it prints READY <control> <replica>... and runs
// until SIGTERM.
func runBackendRole(c childOptions) {
	names := strings.Split(c.names, ",")
	reps := make([]*replicaState, len(names))
	addrs := make([]string, len(names))
	body := func(name string) []byte {
		return []byte(`{"replica":"` + name + `","outputs":[[0.0213,0.9787]],"model":"bench-echo","took_ms":` +
			strconv.FormatFloat(float64(c.serviceTime)/1e6, 'f', -1, 64) + "}\n")
	}
	for i, name := range names {
		rs := &replicaState{name: name}
		reps[i] = rs
		b := body(name)
		st := c.serviceTime
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			now := time.Now().UnixNano()
			rs.count.Add(1)
			rs.last.Store(now)
			rs.firstAfter.CompareAndSwap(0, now)
			_, _ = io.Copy(io.Discard, r.Body)
			time.Sleep(st)
			hd := w.Header()
			hd["Content-Type"] = []string{"application/json"}
			hd["Content-Length"] = []string{strconv.Itoa(len(b))}
			_, _ = w.Write(b)
		})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		addrs[i] = l.Addr().String()
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
		go func() { log.Fatal(srv.Serve(l)) }()
	}
	ctl := http.NewServeMux()
	ctl.HandleFunc("/arrivals", func(w http.ResponseWriter, r *http.Request) {
		out := map[string]arrivals{}
		for _, rs := range reps {
			out[rs.name] = arrivals{Count: rs.count.Load(), Last: rs.last.Load(), FirstAfter: rs.firstAfter.Load()}
		}
		_ = json.NewEncoder(w).Encode(out)
	})
	ctl.HandleFunc("/reset", func(w http.ResponseWriter, r *http.Request) {
		for _, rs := range reps {
			if rs.name == r.URL.Query().Get("name") {
				rs.firstAfter.Store(0)
			}
		}
	})
	cl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { log.Fatal(http.Serve(cl, ctl)) }()
	fmt.Printf("%s %s %s\n", childReadyLine, cl.Addr(), strings.Join(addrs, " "))
	waitSignal()
}

// runGatewayRole runs the gateway as `gpujob gateway run --no-autoscale`
// does (gateway.New, Run, its Server and AdminServer), against c.consul,
// with the default KV prefix and a Nomad of its own that vouches for the
// replicas at c.replicas; net/http/pprof listens apart. It prints READY
// <gateway> <pprof> <GOMAXPROCS> <admin> and runs until SIGTERM.
func runGatewayRole(c childOptions) {
	logger := log.New(os.Stderr, "gateway: ", log.LstdFlags|log.Lmicroseconds|log.Lmsgprefix)
	cfg := consulapi.DefaultConfig()
	cfg.Address = c.consul
	client, err := consulapi.NewClient(cfg)
	if err != nil {
		logger.Fatal(err)
	}
	g, err := gw.New(gw.Config{Consul: client, Nomad: newBenchNomad(c.replicas), Prefix: servekv.DefaultPrefix,
		ID: "bench-gateway", Logf: logger.Printf})
	if err != nil {
		logger.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		if err := g.Run(ctx); err != nil {
			logger.Fatal(err)
		}
	}()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		logger.Fatal(err)
	}
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		logger.Fatal(err)
	}
	al, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		logger.Fatal(err)
	}
	go func() { logger.Fatal(http.Serve(pl, http.DefaultServeMux)) }()
	srv := g.Server()
	go func() { logger.Fatal(srv.Serve(l)) }()
	go func() { logger.Fatal(g.AdminServer("").Serve(al)) }()
	fmt.Printf("%s %s %s %d %s\n", childReadyLine, l.Addr(), pl.Addr(), runtime.GOMAXPROCS(0), al.Addr())
	waitSignal()
}

func waitSignal() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
	os.Exit(0)
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	return host, port, err
}
