package supervisor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/gpujob/gpujob/internal/taskevent"
)

// eventLog appends events (taskevent.Event, one JSON line each) to a file,
// which the driver turns into Nomad task events, and echoes them to the
// task's stderr, so `nomad alloc logs -stderr` tells the same story.
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
	// Never through a link: in a container the file is in the
	// allocation's shared directory (in a directory of root's).
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the events file: %w", err)
	}
	l.file = f
	return l, nil
}

func (l *eventLog) emit(e taskevent.Event) {
	e.Time = time.Now().UTC()
	if e.Message == "" {
		e.Message = e.Describe()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintln(l.echo, e.Echo())
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
func ReadEvents(b []byte) (events []taskevent.Event, consumed int) {
	for {
		i := bytes.IndexByte(b[consumed:], '\n')
		if i < 0 {
			return events, consumed
		}
		var e taskevent.Event
		if json.Unmarshal(b[consumed:consumed+i], &e) == nil {
			events = append(events, e)
		}
		consumed += i + 1
	}
}
