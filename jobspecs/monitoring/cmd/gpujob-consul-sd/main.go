// Command gpujob-consul-sd keeps Prometheus file_sd target files of the
// Consul services gpujob-exporter and gpujob-gateway-admin (for the Prometheus of
// jobspecs/monitoring/prometheus.yml, built without Consul service
// discovery, as Debian's 2.42):
//
//	go run ./jobspecs/monitoring/cmd/gpujob-consul-sd -consul 127.0.0.1:8500 -dir "$dir/sd"
//
// It runs until interrupted. The token is read from -token or
// CONSUL_HTTP_TOKEN.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/gpujob/gpujob/jobspecs/monitoring"
)

func main() {
	addr := flag.String("consul", "127.0.0.1:8500", "Consul's HTTP API `host:port`")
	token := flag.String("token", os.Getenv("CONSUL_HTTP_TOKEN"), "Consul ACL `token` (default $CONSUL_HTTP_TOKEN)")
	dir := flag.String("dir", "", "the `folder` of the target files (<service>.json)")
	services := flag.String("services", monitoring.ExporterService+","+monitoring.GatewayService, "comma-separated Consul `services`")
	quiet := flag.Bool("q", false, "do not log each write")
	flag.Parse()
	if *dir == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := monitoring.SyncConsulFileSD(ctx, *addr, *token, *dir, strings.Split(*services, ","), func(s string, n int) {
		if !*quiet {
			fmt.Fprintf(os.Stderr, "gpujob-consul-sd: %s: %d targets\n", s, n)
		}
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpujob-consul-sd:", err)
		os.Exit(1)
	}
}
