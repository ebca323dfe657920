package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// haproxyConfig is HAProxy's side: the same route as the gateway's (the
// path prefix, a bearer token, the prefix stripped) to the same two
// replicas, least connections, keep-alive both ways. No logging (the
// gateway logs nothing per request either).
func haproxyConfig(listen, secret string, backends []string, nbthread int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
    nbthread %d
    maxconn 4096
    tune.bufsize 16384

defaults
    mode http
    option http-keep-alive
    option forwardfor
    http-reuse always
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    timeout http-request 10s
    timeout http-keep-alive 120s
    timeout queue 30s
    maxconn 4096

frontend bench
    bind %s
    acl bench_route path %s
    acl bench_route path_beg %s/
    acl bench_token req.hdr(authorization) -m str "Bearer %s"
    http-request deny deny_status 404 unless bench_route
    http-request deny deny_status 401 unless bench_token
    http-request del-header authorization
    http-request replace-path ^%s(/.*)?$ \1
    default_backend replicas

backend replicas
    balance leastconn
`, nbthread, listen, routePrefix, routePrefix, secret, routePrefix)
	for i, addr := range backends {
		fmt.Fprintf(&b, "    server r%d %s maxconn 4096\n", i+1, addr)
	}
	return b.String()
}

// startHAProxy starts HAProxy in the foreground (-db) on a free loopback
// port, or records why it is skipped.
func (e *env) startHAProxy() error {
	if e.o.haproxy == "none" || e.o.haproxy == "" {
		e.haSkip = "--haproxy none"
		logf("HAProxy arm skipped (%s)", e.haSkip)
		return nil
	}
	bin, err := exec.LookPath(e.o.haproxy)
	if err != nil {
		e.haSkip = fmt.Sprintf("no %s binary (Debian: apt-get install haproxy)", e.o.haproxy)
		logf("HAProxy arm skipped: %s", e.haSkip)
		return nil
	}
	out, _ := exec.Command(bin, "-v").CombinedOutput()
	e.haVer = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := l.Addr().String()
	l.Close()
	cfgPath := filepath.Join(e.dir, "haproxy.cfg")
	if err := os.WriteFile(cfgPath, []byte(haproxyConfig(addr, e.secret, e.backends, e.o.nbthread)), 0o600); err != nil {
		return err
	}
	if out, err := exec.Command(bin, "-c", "-f", cfgPath).CombinedOutput(); err != nil {
		return fmt.Errorf("haproxy -c: %v: %s", err, out)
	}
	hbin, hargs := e.onProxyCPUs(bin, []string{"-db", "-f", cfgPath})
	hc, err := e.startProcess("haproxy", hbin, hargs, false)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-hc.done:
			return fmt.Errorf("haproxy exited; log: %s", tail(filepath.Join(e.dir, "haproxy.log")))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("haproxy does not listen on %s: %v; log: %s", addr, err, tail(filepath.Join(e.dir, "haproxy.log")))
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.haAddr = addr
	logf("HAProxy on %s (%s, nbthread %d)", addr, e.haVer, e.o.nbthread)
	return nil
}
