package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	consul "github.com/hashicorp/consul/api"
)

// TargetGroup is one entry of a Prometheus file_sd target file.
type TargetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels,omitempty"`
}

// ConsulTargetGroups turns a Consul service's catalog entries into file_sd
// target groups, one per instance, with the labels Prometheus's
// consul_sd_configs gives its targets (__meta_consul_node,
// __meta_consul_address, __meta_consul_dc, __meta_consul_service,
// __meta_consul_service_id, __meta_consul_service_address,
// __meta_consul_service_port, __meta_consul_tags with its leading and
// trailing comma, __meta_consul_service_metadata_<key>), so that one set of
// relabelling rules serves both configurations. Sorted by target.
func ConsulTargetGroups(entries []*consul.CatalogService) []TargetGroup {
	out := make([]TargetGroup, 0, len(entries))
	for _, e := range entries {
		addr := e.ServiceAddress
		if addr == "" {
			addr = e.Address
		}
		l := map[string]string{
			"__meta_consul_node":            e.Node,
			"__meta_consul_address":         e.Address,
			"__meta_consul_dc":              e.Datacenter,
			"__meta_consul_service":         e.ServiceName,
			"__meta_consul_service_id":      e.ServiceID,
			"__meta_consul_service_address": e.ServiceAddress,
			"__meta_consul_service_port":    strconv.Itoa(e.ServicePort),
			"__meta_consul_tags":            "," + strings.Join(e.ServiceTags, ",") + ",",
		}
		for k, v := range e.ServiceMeta {
			l["__meta_consul_service_metadata_"+sanitizeLabel(k)] = v
		}
		out = append(out, TargetGroup{Targets: []string{net.JoinHostPort(addr, strconv.Itoa(e.ServicePort))}, Labels: l})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Targets[0] != out[j].Targets[0] {
			return out[i].Targets[0] < out[j].Targets[0]
		}
		return out[i].Labels["__meta_consul_service_id"] < out[j].Labels["__meta_consul_service_id"]
	})
	return out
}

func sanitizeLabel(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

// WriteFileSD writes groups to path as a file_sd target file, atomically
// (a temporary file renamed over it), so Prometheus never reads half a file.
func WriteFileSD(path string, groups []TargetGroup) error {
	if groups == nil {
		groups = []TargetGroup{}
	}
	b, err := json.MarshalIndent(groups, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// SyncConsulFileSD keeps dir/<service>.json, for each service (default:
// gpujob-exporter and gpujob-gateway-admin), the file_sd target file of the
// service's instances in Consul's catalog (ConsulTargetGroups), following
// the catalog with blocking queries, until ctx ends (then it returns nil).
// It writes each file (an empty list where Consul cannot be reached yet)
// before its first query, so Prometheus can start at once; onWrite, when not
// nil, is called after each write, with the service and its group count.
// The stand-in for consul_sd_configs where Prometheus lacks it (Debian's
// 2.42): prometheus.yml reads these files.
func SyncConsulFileSD(ctx context.Context, consulAddr, consulToken, dir string, services []string, onWrite func(service string, n int)) error {
	if len(services) == 0 {
		services = []string{ExporterService, GatewayService}
	}
	cfg := consul.DefaultConfig()
	cfg.Address = consulAddr
	cfg.Token = consulToken
	client, err := consul.NewClient(cfg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, s := range services {
		p := filepath.Join(dir, s+".json")
		if _, err := os.Stat(p); os.IsNotExist(err) {
			if err := WriteFileSD(p, nil); err != nil {
				return err
			}
		}
	}
	var wg sync.WaitGroup
	for _, s := range services {
		wg.Add(1)
		go func(service string) {
			defer wg.Done()
			followService(ctx, client, service, filepath.Join(dir, service+".json"), onWrite)
		}(s)
	}
	wg.Wait()
	return nil
}

func followService(ctx context.Context, client *consul.Client, service, path string, onWrite func(string, int)) {
	var index uint64
	var last []byte
	backoff := 500 * time.Millisecond
	for ctx.Err() == nil {
		q := (&consul.QueryOptions{WaitIndex: index, WaitTime: 30 * time.Second}).WithContext(ctx)
		entries, meta, err := client.Catalog().Service(service, "", q)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 500 * time.Millisecond
		if meta.LastIndex < index { // the index went back (Consul restarted): start over
			index = 0
		} else {
			index = meta.LastIndex
		}
		groups := ConsulTargetGroups(entries)
		b, _ := json.Marshal(groups)
		if string(b) == string(last) {
			continue
		}
		if err := WriteFileSD(path, groups); err != nil {
			fmt.Fprintf(os.Stderr, "monitoring: %s: %v\n", path, err)
			continue
		}
		last = b
		if onWrite != nil {
			onWrite(service, len(groups))
		}
	}
}
