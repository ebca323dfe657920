package policy

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckAdmissible(t *testing.T) {
	cfg := Config{Queues: []QueueConfig{
		{Name: "team-a", GPUs: 8},
		{Name: "team-b", GPUs: 8, Borrow: true},
		{Name: "team-c", GPUs: 4, Borrow: true},
	}}
	nodes := gpuNodes(4, 8) // 32 GPUs
	tests := []struct {
		name   string
		cfg    Config
		job    Job
		errHas string // "" means admissible
	}{
		{"fits", cfg, gang("ok", "team-a", 2, 4, 0), ""},
		{"a member larger than any node", cfg, gang("x", "team-b", 1, 16, 0), "no node has that (the largest has 8 GPUs)"},
		{"larger than the whole cluster", Config{}, gang("x", "", 5, 8, 0), "needs 5 members × 8 GPUs (40 GPUs); the whole cluster (4 nodes, 32 GPUs) holds at most 4"},
		{"over its quota, borrowing off", cfg, gang("x", "team-a", 3, 4, 0), "needs 12 GPUs; queue team-a's quota is 8 GPUs and borrowing is off"},
		{"over its quota, borrowing on: fine", cfg, gang("x", "team-b", 3, 4, 0), ""},
		{"over its cohort's quota", cfg, gang("x", "team-b", 4, 8, 0), "its cohort default has 20 GPUs of quota in all"},
		{"unknown queue lists the queues", cfg, gang("x", "team-z", 1, 1, 0), `unknown queue "team-z" (queues: team-a, team-b, team-c)`},
		{"no queue means the default queue, which must exist", cfg, gang("x", "", 1, 1, 0), `unknown queue "default"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckAdmissible(tt.cfg, nodes, tt.job)
			if tt.errHas == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.errHas) {
				t.Fatalf("err %v; want %q in it", err, tt.errHas)
			}
		})
	}
	var unknown *UnknownQueueError
	if !errors.As(CheckAdmissible(cfg, nodes, gang("x", "nope", 1, 1, 0)), &unknown) {
		t.Fatal("an unknown queue is not an UnknownQueueError")
	}
}

// Decide refuses what CheckAdmissible refuses, and decides the rest.
func TestDecideRefusesInadmissible(t *testing.T) {
	s := State{Nodes: gpuNodes(1, 8), Pending: []Job{gang("big", "", 2, 8, 0), gang("lost", "nope", 1, 1, 1), gang("ok", "", 1, 1, 2)}}
	d := decide(t, s)
	checkInvariants(t, s, d)
	if len(d.Refused) != 2 || len(d.Admit) != 1 {
		t.Fatalf("refused %+v, admitted %v", d.Refused, admitted(d))
	}
}

func TestValidate(t *testing.T) {
	for _, cfg := range []Config{
		{Queues: []QueueConfig{{Name: "a"}, {Name: "a"}}},
		{Queues: []QueueConfig{{Name: ""}}},
		{Queues: []QueueConfig{{Name: "a", GPUs: -1}}},
		{Queues: []QueueConfig{{Name: "a", Weight: -1}}},
	} {
		if cfg.Validate() == nil {
			t.Errorf("%+v accepted", cfg)
		}
		if _, err := Decide(State{Config: cfg}); err == nil {
			t.Errorf("Decide accepted %+v", cfg)
		}
	}
}
