package rendezvous

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// benchConsulEnv names an external Consul (host:port of its HTTP API, e.g.
// a 3-server cluster's local agent) for the benchmarks instead of the dev
// agent the test binary starts. CONSUL_HTTP_TOKEN and the other
// CONSUL_HTTP_* variables apply to it.
const benchConsulEnv = "GPUJOB_BENCH_CONSUL_ADDR"

// benchConsul returns the Consul the benchmarks run against and the
// transport that counts their requests.
func benchConsul(b *testing.B) (string, *api.Client, *countingTransport) {
	addr := os.Getenv(benchConsulEnv)
	if addr == "" {
		needConsul(b)
		return testAgent.addr, testAgent.client, testAgent.count
	}
	count := &countingTransport{base: &http.Transport{
		MaxIdleConnsPerHost: 8192,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true, // as the supervisor's client (consulClient)
	}}
	cfg := api.DefaultConfig()
	cfg.Address = addr
	cfg.HttpClient = &http.Client{Transport: count}
	c, err := api.NewClient(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return addr, c, count
}

// BenchmarkRound measures, for M in-process members against the test agent
// (or the Consul at $GPUJOB_BENCH_CONSUL_ADDR), the time from nothing to
// every member holding the complete round (Open + Join, so it includes
// creating M sessions), and the Consul HTTP requests that took per member
// (req/member; must not grow with M).
//
//	go test -run '^$' -bench BenchmarkRound -benchtime 1x ./driver/rendezvous/
//	GPUJOB_BENCH_CONSUL_ADDR=127.0.0.1:8500 go test -run '^$' -bench 'BenchmarkRound$' -benchtime 1x ./driver/rendezvous/
func BenchmarkRound(b *testing.B) {
	_, c, count := benchConsul(b)
	for _, m := range []int{8, 64, 256, 1024} {
		b.Run(fmt.Sprintf("M=%d", m), func(b *testing.B) {
			var reqs int64
			for n := 0; n < b.N; n++ {
				b.StopTimer()
				runID := fmt.Sprintf("bench/M%d-%d-%d", m, n, time.Now().UnixNano())
				rs := make([]*Rendezvous, m)
				for i := range rs {
					r, err := New(Config{Client: c, RunID: runID, Min: m, Max: m, JoinTimeout: time.Minute},
						Member{ID: fmt.Sprintf("alloc-%d", i), Name: memberName(i), Addr: fmt.Sprintf("10.0.%d.%d:29500", i/256, i%256), LocalWorldSize: 1 + i%2})
					if err != nil {
						b.Fatal(err)
					}
					rs[i] = r
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				count.mu.Lock()
				count.byKind = map[string]int{}
				count.mu.Unlock()
				before := count.n.Load()
				errs := make([]error, m)
				rounds := make([]*Round, m)
				var wg sync.WaitGroup
				opened, joined := make([]time.Duration, m), make([]time.Duration, m)
				t0 := time.Now()
				b.StartTimer()
				for i, r := range rs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := r.Open(ctx); err != nil {
							errs[i] = err
							return
						}
						opened[i] = time.Since(t0)
						rounds[i], errs[i] = r.Join(ctx)
						joined[i] = time.Since(t0)
					}()
				}
				wg.Wait()
				b.StopTimer()
				reqs += count.n.Load() - before
				slices.Sort(opened)
				slices.Sort(joined)
				b.Logf("M=%d: sessions open: median %s, last %s; Join returned: first %s, p10 %s, median %s, p90 %s, last %s", m, opened[m/2], opened[m-1], joined[0], joined[m/10], joined[m/2], joined[m*9/10], joined[m-1])
				count.mu.Lock()
				b.Logf("M=%d requests by kind: %v", m, count.byKind)
				count.byKind = nil
				count.mu.Unlock()
				for i, err := range errs {
					if err != nil {
						b.Fatalf("member %d: %v", i, err)
					}
					if rounds[i].WorldSize != rounds[0].WorldSize || len(rounds[i].Members) != m {
						b.Fatalf("member %d: bad round %+v", i, rounds[i])
					}
				}
				for i, r := range rs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := r.Done(ctx, rounds[i]); err != nil {
							b.Error(err)
						}
						if err := r.Close(ctx); err != nil {
							b.Error(err)
						}
					}()
				}
				wg.Wait()
				cancel()
			}
			b.ReportMetric(float64(reqs)/float64(b.N*m), "req/member")
		})
	}
}

// BenchmarkDecodeRoster: what every member of a 1024-member round spends
// reading the roster that completes it (BenchmarkRound runs 1024 of these
// on one machine).
//
//	go test -short -run '^$' -bench DecodeRoster ./driver/rendezvous/
func BenchmarkDecodeRoster(b *testing.B) {
	ms := make([]Member, 1024)
	for i := range ms {
		ms[i] = Member{ID: fmt.Sprintf("%08x-1c2d-4e5f-8a9b-%012x", i*7919, i), Name: memberName(i), Addr: fmt.Sprintf("10.0.%d.%d:29500", i/256, i%256), LocalWorldSize: 8}
	}
	sortMembers(ms)
	data := encodeRoster(3, ms)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, got, err := decodeRoster(data); err != nil || len(got) != len(ms) {
			b.Fatal(len(got), err)
		}
	}
}
