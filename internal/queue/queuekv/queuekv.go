// Package queuekv is the queues' records in Consul KV: the layout, the
// JSON each key holds, and a store that reads and writes them.
//
//	<prefix>/config   Record   `gpujob queue apply` writes (check-and-set); the CLI
//	                           (submit's check, queue list and status) and the
//	                           admission controller read
//
// The prefix is contract.QueuePrefix ("gpujob/queues"), a tree no token a
// job can reach has write on (see internal/contract). A record read back
// is still checked as strictly as a queue file (queuefile.Validate), and
// more: unknown fields, another format, control characters in who applied
// it — a value that fails is an error, never a configuration.
package queuekv

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/consul"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
)

// DefaultPrefix is where the queues' records live.
const DefaultPrefix = contract.QueuePrefix

// ConfigKey is the key of the applied configuration under prefix.
func ConfigKey(prefix string) string { return strings.TrimSuffix(prefix, "/") + "/config" }

// Format is the Record layout this package writes and reads.
const Format = 1

// MaxRecordBytes bounds a stored record: Consul's own limit on a value.
const MaxRecordBytes = 512 << 10

// maxTextLen bounds the record's free-text fields.
const maxTextLen = 256

// Record is the applied queue configuration and who applied it.
type Record struct {
	Format int     `json:"format"`
	Queues []Queue `json:"queues"`
	// File is the queue file's name as given to apply; SHA256 is the hex
	// SHA-256 of its bytes.
	File   string `json:"file"`
	SHA256 string `json:"sha256"`
	// AppliedBy is who applied it (user@host); AppliedAt when.
	AppliedBy string    `json:"applied_by"`
	AppliedAt time.Time `json:"applied_at"`
}

// Queue is one queue of a Record: policy.QueueConfig with JSON names.
type Queue struct {
	Name     string  `json:"name"`
	GPUs     int     `json:"gpus"`
	Weight   float64 `json:"weight"`
	Borrow   bool    `json:"borrow"`
	Priority int     `json:"priority"`
	Cohort   string  `json:"cohort,omitempty"`
}

// Queues is cfg's queues as a Record holds them.
func Queues(cfg policy.Config) []Queue {
	out := make([]Queue, 0, len(cfg.Queues))
	for _, q := range cfg.Queues {
		out = append(out, Queue(q))
	}
	return out
}

// Config is the record's queue configuration (nil record: none, the
// default queue alone).
func (r *Record) Config() policy.Config {
	var cfg policy.Config
	if r == nil {
		return cfg
	}
	for _, q := range r.Queues {
		cfg.Queues = append(cfg.Queues, policy.QueueConfig(q))
	}
	return cfg
}

// Check reports a record that may not be stored or believed.
func (r *Record) Check() error {
	switch {
	case r.Format != Format:
		return fmt.Errorf("format %d; this gpujob reads format %d (apply the queue file again with this gpujob)", r.Format, Format)
	case len(r.SHA256) != 64 || strings.ToLower(r.SHA256) != r.SHA256:
		return fmt.Errorf("sha256 %q is not a SHA-256 in hex", clip(r.SHA256))
	case r.AppliedAt.IsZero():
		return errors.New("no applied_at")
	}
	if _, err := hex.DecodeString(r.SHA256); err != nil {
		return fmt.Errorf("sha256 %q is not a SHA-256 in hex", clip(r.SHA256))
	}
	for _, f := range []struct{ name, v string }{{"file", r.File}, {"applied_by", r.AppliedBy}} {
		if err := checkText(f.v); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
	if err := queuefile.Validate(r.Config()); err != nil {
		return err
	}
	return nil
}

// checkText refuses what would be unsafe to print on a terminal (control
// characters: escape sequences), invalid UTF-8, and long text.
func checkText(s string) error { return queuefile.CheckText(s, maxTextLen) }

func clip(s string) string { return queuefile.Clip(s) }

// Encode is the record's stored form; it refuses a record Check refuses.
func Encode(r *Record) ([]byte, error) {
	if err := r.Check(); err != nil {
		return nil, fmt.Errorf("queue configuration: %w", err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxRecordBytes {
		return nil, fmt.Errorf("queue configuration: %d bytes encoded; Consul holds at most %d in one value", len(b), MaxRecordBytes)
	}
	return b, nil
}

// Decode reads a stored record: one JSON object of exactly Record's fields
// whose values pass Check.
func Decode(b []byte) (*Record, error) {
	if len(b) > MaxRecordBytes {
		return nil, fmt.Errorf("%d bytes; a record is at most %d", len(b), MaxRecordBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var r Record
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("not a queue configuration record: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not a queue configuration record: more after the JSON object")
	}
	if err := r.Check(); err != nil {
		return nil, err
	}
	return &r, nil
}

// ErrConflict is a write whose check-and-set failed: the configuration
// changed (or appeared, or went) since it was read.
var ErrConflict = errors.New("the queue configuration in Consul changed since it was read")

// Store is the queues' records under Prefix.
type Store struct {
	Client *api.Client
	Prefix string
}

// New is a Store at prefix ("" is DefaultPrefix).
func New(c *api.Client, prefix string) Store {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return Store{Client: c, Prefix: strings.TrimSuffix(prefix, "/")}
}

// Key is the configuration's key.
func (s Store) Key() string { return ConfigKey(s.Prefix) }

// InvalidError is a stored value that is not a valid record.
type InvalidError struct {
	Key string
	Err error
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("the queue configuration at %s is invalid (%v): apply a queue file again (gpujob queue apply)", e.Key, e.Err)
}

func (e *InvalidError) Unwrap() error { return e.Err }

// Read returns the applied record, nil when none was applied, and the
// index to check-and-set against (0 when none). A stored value that is not
// a valid record is an *InvalidError.
func (s Store) Read(ctx context.Context) (*Record, uint64, error) {
	kv, _, err := s.Client.KV().Get(s.Key(), (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, 0, fmt.Errorf("reading %s: %w", s.Key(), err)
	}
	return s.decode(kv)
}

func (s Store) decode(kv *api.KVPair) (*Record, uint64, error) {
	if kv == nil {
		return nil, 0, nil
	}
	r, err := Decode(kv.Value)
	if err != nil {
		return nil, kv.ModifyIndex, &InvalidError{Key: s.Key(), Err: err}
	}
	return r, kv.ModifyIndex, nil
}

// Write stores r if the configuration is still at index (0: if there is
// none), in one transaction; it returns the new index. A failed
// check-and-set is ErrConflict, and nothing is written.
func (s Store) Write(ctx context.Context, r *Record, index uint64) (uint64, error) {
	b, err := Encode(r)
	if err != nil {
		return 0, err
	}
	ops := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: s.Key(), Value: b, Index: index}}}
	ok, resp, _, err := s.Client.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return 0, fmt.Errorf("writing %s: %w", s.Key(), err)
	}
	if !ok {
		return 0, ErrConflict
	}
	for _, res := range resp.Results {
		if res.KV != nil && res.KV.Key == s.Key() {
			return res.KV.ModifyIndex, nil
		}
	}
	return 0, fmt.Errorf("writing %s: Consul's answer names no such key", s.Key())
}

// Watch delivers the configuration whenever it changes (first: as it is
// now), with consul.Watch's blocking queries: a record, nil when none is
// applied, or an *InvalidError for a value that is not a valid record (the
// caller keeps what it had, or refuses to act). It returns as
// consul.Watch does.
func (s Store) Watch(ctx context.Context, opts consul.WatchOptions, deliver func(r *Record, index uint64, err error) error) error {
	return consul.Watch(ctx, consul.KeyQuery(s.Client, s.Key()), opts, func(kv *api.KVPair, index uint64) error {
		r, _, err := s.decode(kv)
		return deliver(r, index, err)
	})
}
