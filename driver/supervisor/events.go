package supervisor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Event is one milestone of the supervisor, written as a JSON line to the
// events file; the driver turns each into a Nomad task event.
type Event struct {
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"` // joined, restarting, succeeded, failed, stopped
	Message  string    `json:"message"`
	Round    int       `json:"round,omitempty"`
	NodeRank int       `json:"node_rank"`
	Restarts int       `json:"restarts"`
}

// Event kinds.
const (
	EventJoined     = "joined"
	EventRestarting = "restarting"
	EventSucceeded  = "succeeded"
	EventFailed     = "failed"
	EventStopped    = "stopped"
)

// eventLog appends events to a file and echoes them to the task's stderr, so
// `nomad alloc logs -stderr` tells the same story as the task events.
type eventLog struct {
	mu   sync.Mutex
	file *os.File
	echo io.Writer
}

func openEventLog(path string, echo io.Writer) (*eventLog, error) {
	l := &eventLog{echo: echo}
	if path == "" {
		return l, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the events file: %w", err)
	}
	l.file = f
	return l, nil
}

func (l *eventLog) emit(e Event) {
	e.Time = time.Now().UTC()
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.echo, "gpujob: %s\n", e.Message)
	if l.file == nil {
		return
	}
	b, _ := json.Marshal(e)
	_, _ = l.file.Write(append(b, '\n'))
}

func (l *eventLog) close() {
	if l.file != nil {
		_ = l.file.Close()
	}
}

// ReadEvents decodes the events in b, a prefix of an events file; a trailing
// partial line is left for the next read; consumed is how many bytes were used.
func ReadEvents(b []byte) (events []Event, consumed int) {
	for {
		i := bytes.IndexByte(b[consumed:], '\n')
		if i < 0 {
			return events, consumed
		}
		var e Event
		if json.Unmarshal(b[consumed:consumed+i], &e) == nil {
			events = append(events, e)
		}
		consumed += i + 1
	}
}
