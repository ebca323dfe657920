package e2e

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// socket is one bound socket of this network namespace, from /proc/net.
type socket struct {
	proto string // tcp, tcp6, udp, udp6
	addr  net.IP
	port  int
	inode string
}

func (s socket) String() string {
	return fmt.Sprintf("%s %s", s.proto, net.JoinHostPort(s.addr.String(), strconv.Itoa(s.port)))
}

// Socket states in /proc/net/*: a listening TCP socket, and an unconnected
// UDP one (bound, taking datagrams from anyone: Serf, Consul's DNS).
const (
	tcpListen   = "0A"
	udpUnconned = "07"
)

// listeningSockets reads /proc/net/{tcp,tcp6,udp,udp6}: every listening TCP
// socket and every unconnected UDP socket, by inode.
func listeningSockets(t *testing.T) map[string]socket {
	t.Helper()
	out := map[string]socket{}
	for _, proto := range []string{"tcp", "tcp6", "udp", "udp6"} {
		f, err := os.Open("/proc/net/" + proto)
		if err != nil {
			if os.IsNotExist(err) && strings.HasSuffix(proto, "6") {
				continue // no IPv6 in this kernel
			}
			t.Fatal(err)
		}
		socks, err := parseProcNet(proto, f)
		f.Close()
		if err != nil {
			t.Fatalf("/proc/net/%s: %v", proto, err)
		}
		for _, s := range socks {
			out[s.inode] = s
		}
	}
	return out
}

// parseProcNet parses one /proc/net/{tcp,udp}[6] table, keeping listeners.
func parseProcNet(proto string, f io.Reader) ([]socket, error) {
	want := tcpListen
	if strings.HasPrefix(proto, "udp") {
		want = udpUnconned
	}
	var out []socket
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			return nil, fmt.Errorf("short line %q", sc.Text())
		}
		if fields[3] != want {
			continue
		}
		ip, port, err := parseProcAddr(fields[1])
		if err != nil {
			return nil, err
		}
		out = append(out, socket{proto: proto, addr: ip, port: port, inode: fields[9]})
	}
	return out, sc.Err()
}

// parseProcAddr decodes "0100007F:1F90": the address as the kernel stores
// it, in 32-bit words of host byte order (little-endian here), then the port.
func parseProcAddr(s string) (net.IP, int, error) {
	hexIP, hexPort, ok := strings.Cut(s, ":")
	if !ok {
		return nil, 0, fmt.Errorf("address %q has no port", s)
	}
	raw, err := hex.DecodeString(hexIP)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return nil, 0, fmt.Errorf("address %q: bad IP", s)
	}
	ip := make(net.IP, len(raw))
	for w := 0; w < len(raw); w += 4 {
		for i := 0; i < 4; i++ {
			ip[w+i] = raw[w+3-i]
		}
	}
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if err != nil {
		return nil, 0, fmt.Errorf("address %q: bad port", s)
	}
	return ip, int(port), nil
}

// socketInodes lists the socket inodes pid holds open.
func socketInodes(pid int) []string {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return nil // gone meanwhile
	}
	var out []string
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(dir, fd.Name()))
		if err == nil && strings.HasPrefix(target, "socket:[") {
			out = append(out, strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]"))
		}
	}
	return out
}

// clusterDaemons lists the cluster's agents (its PID files) and everything
// they started that is not a task: plugins, executors, logmons. A task
// (a supervisor and its ranks) is the job's own business, so the subtree
// under a supervisor is left out.
func (c *cluster) clusterDaemons(t *testing.T) map[int]string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(c.dir, "pids", "*.pid"))
	if len(files) == 0 {
		t.Fatalf("no PID files in %s/pids", c.dir)
	}
	children := map[int][]int{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		if ppid, zombie := procStat(pid); !zombie {
			children[ppid] = append(children[ppid], pid)
		}
	}
	out := map[int]string{}
	var walk func(pid int, name string)
	walk = func(pid int, name string) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if len(args) > 1 && args[1] == "supervise" {
			return
		}
		out[pid] = name + ": " + strings.Join(args, " ")
		for _, ch := range children[pid] {
			walk(ch, name)
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		walk(pid, strings.TrimSuffix(filepath.Base(f), ".pid"))
	}
	return out
}

// loopbackOnly checks the listeners of the given processes: every one must
// be bound to 127.0.0.0/8 or ::1. It returns how many it saw, and the ones
// bound elsewhere (a wildcard address included).
func loopbackOnly(procs map[int]string, socks map[string]socket) (int, []string) {
	seen := 0
	var bad []string
	for pid, who := range procs {
		for _, ino := range socketInodes(pid) {
			s, ok := socks[ino]
			if !ok {
				continue // not a listener (a connection, a unix socket)
			}
			seen++
			if !s.addr.IsLoopback() {
				bad = append(bad, fmt.Sprintf("%s (pid %d, %s)", s, pid, who))
			}
		}
	}
	sort.Strings(bad)
	return seen, bad
}

func TestProcNetParsing(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0000000000000000 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1002 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 1003 1 0000000000000000 20 4 30 10 -1
`
	socks, err := parseProcNet("tcp", strings.NewReader(table))
	if err != nil {
		t.Fatal(err)
	}
	if len(socks) != 2 || socks[0].inode != "1001" || socks[1].String() != "tcp 0.0.0.0:22" {
		t.Errorf("listeners %v, want inode 1001 on 127.0.0.1:8080 and tcp 0.0.0.0:22 (not the connection)", socks)
	}

	cases := []struct {
		in       string
		ip       string
		port     int
		loopback bool
	}{
		{"0100007F:1F90", "127.0.0.1", 8080, true},
		{"0200007F:1216", "127.0.0.2", 4630, true},
		{"00000000:1F90", "0.0.0.0", 8080, false},
		{"0100A8C0:0035", "192.168.0.1", 53, false},
		{"00000000000000000000000001000000:1F90", "::1", 8080, true},
		{"00000000000000000000000000000000:1F90", "::", 8080, false},
		{"0000000000000000FFFF00000100007F:1F90", "127.0.0.1", 8080, true}, // ::ffff:127.0.0.1
	}
	for _, c := range cases {
		ip, port, err := parseProcAddr(c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if !ip.Equal(net.ParseIP(c.ip)) || port != c.port || ip.IsLoopback() != c.loopback {
			t.Errorf("%s → %s:%d (loopback %v), want %s:%d (loopback %v)", c.in, ip, port, ip.IsLoopback(), c.ip, c.port, c.loopback)
		}
	}
}

// Nothing the dev cluster runs listens beyond 127.0.0.0/8, in either mode:
// Consul's HTTP(S), DNS, gRPC, server RPC and Serf LAN/WAN ports, Nomad's
// HTTP, RPC and Serf ports, the plugins, executors and logmons.
func TestListenersStayOnLoopback(t *testing.T) {
	clusters := map[string]*cluster{"dev": needCluster(t), "ACL and TLS": secureCluster(t)}

	// The check itself must see a socket when a process holds one: this
	// test's own loopback listener, found through the same tables.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if seen, bad := loopbackOnly(map[int]string{os.Getpid(): "the test"}, listeningSockets(t)); seen != 1 || len(bad) != 0 {
		t.Fatalf("the check found %d listeners of this test (want 1), %v bound elsewhere", seen, bad)
	}

	for name, c := range clusters {
		procs := c.clusterDaemons(t)
		seen, bad := loopbackOnly(procs, listeningSockets(t))
		// One Consul server and one Nomad server and client: Consul alone
		// holds at least its server RPC, Serf LAN and WAN (TCP and UDP),
		// HTTP(S), DNS (TCP and UDP) and gRPC TLS listeners.
		if seen < 10 {
			t.Errorf("%s cluster: only %d listeners found among %d processes: the check is not seeing them", name, seen, len(procs))
		}
		for _, b := range bad {
			t.Errorf("%s cluster: listens beyond loopback: %s", name, b)
		}
		t.Logf("%s cluster: %d listeners of %d processes, all on loopback", name, seen, len(procs))
	}
}
