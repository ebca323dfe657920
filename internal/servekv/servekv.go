// Package servekv is the layout of gpujob services' records in Consul KV: the
// keys and the JSON each holds. It is the contract between `gpujob service`
// and `gpujob token` (which write) and the gateway (which reads, and whose
// instances report and elect through it), so none parses another's output.
// It imports nothing of Nomad or Consul.
//
//	<prefix>/<ns>/<service>/route              Route   service deploy writes; gateways watch
//	<prefix>/<ns>/<service>/tokens/<hash>      Token   gpujob token create/revoke; gateways watch
//
// and, in a tree of their own (so that the gateways' frequent load reports
// never wake a watch of the routes):
//
//	<gateway prefix>/leader                    -       the autoscaling gateway's Consul lock
//	<gateway prefix>/load/<gateway id>         Load    each gateway, under its session
//
// Every name segment is safename-encoded, so a namespace or service name can
// never leave its place in the tree.
package servekv

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/gpujob/gpujob/internal/safename"
)

// DefaultPrefix is where services live unless the CLI's and the gateway's
// --key-prefix say otherwise; a sibling of the rendezvous and sweep trees, so
// ACL policies can grant each on its own.
const DefaultPrefix = "gpujob/services"

// DefaultGatewayPrefix is the gateways' own tree.
const DefaultGatewayPrefix = "gpujob/gateway"

// ServiceKey is the root of one service's records, without a trailing slash.
func ServiceKey(prefix, namespace, service string) string {
	return fmt.Sprintf("%s/%s/%s", prefix, safename.Encode(namespace), safename.Encode(service))
}

// RouteKey holds the service's Route.
func RouteKey(prefix, namespace, service string) string {
	return ServiceKey(prefix, namespace, service) + "/route"
}

// TokensPrefix is the folder of the service's tokens, with a trailing slash.
func TokensPrefix(prefix, namespace, service string) string {
	return ServiceKey(prefix, namespace, service) + "/tokens/"
}

// TokenKey holds one Token, named by the hash of its secret (never the
// secret itself).
func TokenKey(prefix, namespace, service, hash string) string {
	return TokensPrefix(prefix, namespace, service) + hash
}

// LeaderKey is the gateways' autoscaling lock; LoadPrefix the folder of
// their Load reports and LoadKey one gateway's, all under the gateway prefix.
func LeaderKey(gatewayPrefix string) string  { return gatewayPrefix + "/leader" }
func LoadPrefix(gatewayPrefix string) string { return gatewayPrefix + "/load/" }
func LoadKey(gatewayPrefix, gatewayID string) string {
	return LoadPrefix(gatewayPrefix) + safename.Encode(gatewayID)
}

// ParseRouteKey returns the namespace and service a RouteKey names; ok is
// false for any other key under prefix.
func ParseRouteKey(prefix, key string) (namespace, service string, ok bool) {
	rest, found := strings.CutPrefix(key, prefix+"/")
	if !found {
		return "", "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 || parts[2] != "route" {
		return "", "", false
	}
	ns, err1 := safename.Decode(parts[0])
	svc, err2 := safename.Decode(parts[1])
	if err1 != nil || err2 != nil {
		return "", "", false
	}
	return ns, svc, true
}

// ParseTokenKey returns the namespace, service and hash a TokenKey names.
func ParseTokenKey(prefix, key string) (namespace, service, hash string, ok bool) {
	rest, found := strings.CutPrefix(key, prefix+"/")
	if !found {
		return "", "", "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 4 || parts[2] != "tokens" || !validHash(parts[3]) {
		return "", "", "", false
	}
	ns, err1 := safename.Decode(parts[0])
	svc, err2 := safename.Decode(parts[1])
	if err1 != nil || err2 != nil {
		return "", "", "", false
	}
	return ns, svc, parts[3], true
}

// Route is what a gateway needs to route to a service, written by `gpujob
// service deploy` (and rewritten by scale and rollback).
type Route struct {
	Namespace string `json:"namespace"`
	Service   string `json:"service"`
	// ConsulService is the Consul catalog name the replicas register
	// under, and Tag the tag that picks this namespace's replicas out of it
	// (Consul OSS has no namespaces of its own).
	ConsulService string `json:"consul_service"`
	Tag           string `json:"tag"`
	// PathPrefix routes requests whose path starts with it (segment-wise)
	// and strips it before proxying; Host, when set, must also match.
	PathPrefix string   `json:"path_prefix"`
	Host       string   `json:"host,omitempty"`
	Auth       bool     `json:"auth"`
	RateLimit  *Limit   `json:"rate_limit,omitempty"` // per token; nil = none
	Timeout    Duration `json:"timeout"`              // per request, 0 = none
	// MaxBodyBytes bounds a request's body (the gateway buffers it whole,
	// so that a refused connection can be retried); 0 = the gateway's
	// default (--max-body).
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// QueueLimit and QueueTimeout bound the requests held while the service
	// has no healthy replica (a cold start, a scale from zero).
	QueueLimit   int      `json:"queue_limit"`
	QueueTimeout Duration `json:"queue_timeout"`
	// JobID and Group are the Nomad job and task group whose allocations
	// serve the route and which the autoscaler scales. They are only
	// believed when that job claims the route in its own meta (JobRoute):
	// the route is a Consul key that every user of the namespace may write.
	JobID     string     `json:"job_id"`
	Group     string     `json:"group"`
	Autoscale *Autoscale `json:"autoscale,omitempty"`
}

// Limit is a token bucket: RPS requests per second on average, Burst at once.
type Limit struct {
	RPS   float64 `json:"rps"`
	Burst int     `json:"burst"`
}

// Autoscale is the spec's replicas and autoscale blocks.
type Autoscale struct {
	Min            int      `json:"min"`
	Max            int      `json:"max"`
	TargetInflight float64  `json:"target_inflight"` // per replica
	ScaleUpDelay   Duration `json:"scale_up_delay"`
	ScaleDownDelay Duration `json:"scale_down_delay"`
}

// Token is one bearer token of a service, stored under the hash of its
// secret. The secret is shown once, when created, and kept nowhere.
type Token struct {
	ID      string    `json:"id"` // public: the first 12 hex digits of the hash
	Name    string    `json:"name,omitempty"`
	Limit   *Limit    `json:"rate_limit,omitempty"` // nil: the route's
	Created time.Time `json:"created"`
}

// Load is one gateway's report for the autoscaler: in-flight and held
// requests per service ("<ns>/<service>"), and when it was taken.
type Load struct {
	Gateway  string         `json:"gateway"`
	Inflight map[string]int `json:"inflight"`
	Queued   map[string]int `json:"queued"`
	Updated  time.Time      `json:"updated"`
}

// LoadName is a service's name in Load's maps.
func LoadName(namespace, service string) string { return namespace + "/" + service }

// SecretPrefix starts every token secret, so one found in a log or a
// repository is recognisable.
const SecretPrefix = "gjt_"

// NewSecret returns a fresh bearer secret (256 random bits), the hash it
// is stored under and its public ID.
func NewSecret() (secret, hash, id string, err error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", "", fmt.Errorf("reading random bytes for a token: %w", err)
	}
	secret = SecretPrefix + base64.RawURLEncoding.EncodeToString(b)
	hash = HashSecret(secret)
	return secret, hash, TokenID(hash), nil
}

// HashSecret is the hex SHA-256 of a secret. The secrets are random, so a
// fast unsalted hash is enough: there is nothing to guess from a list.
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// TokenID is a token's public ID from its hash.
func TokenID(hash string) string {
	if len(hash) < 12 {
		return hash
	}
	return hash[:12]
}

// SameHash compares two hashes in constant time.
func SameHash(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

func validHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

// Duration is a time.Duration that reads and writes as "1.5s" in JSON.
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// Std is the time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// GatewayStats is a gateway's /-/stats: its recent figures per service
// ("<ns>/<service>"), for `gpujob service status`.
type GatewayStats struct {
	Gateway  string           `json:"gateway"`
	Services map[string]Stats `json:"services"`
}

// Stats are one service's figures over the gateway's recent window.
type Stats struct {
	Window   string  `json:"window"` // e.g. "1m0s"
	Requests int64   `json:"requests"`
	RPS      float64 `json:"rps"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	Errors   int64   `json:"errors"` // 5xx answered in the window
	Inflight int     `json:"inflight"`
	Queued   int     `json:"queued"`
}
