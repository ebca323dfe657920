package autoscale

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/gpujob/gpujob/internal/servekv"
)

// StaleAfter is the age past which a gateway's load report no longer
// counts: its gateway stopped reporting (stuck, or cut off from Consul)
// though its session still holds the key.
const StaleAfter = 5 * time.Second

// Aggregate sums the fresh reports' in-flight and queued requests for the
// service name (servekv.LoadName) and counts the fresh reports. A report is
// stale when its Updated is more than StaleAfter before now; one from the
// future (a gateway's clock slightly ahead) counts as fresh.
func Aggregate(reports []servekv.Load, name string, now time.Time) (inflight, queued, gateways int) {
	for _, r := range reports {
		if now.Sub(r.Updated) > StaleAfter {
			continue
		}
		gateways++
		inflight += max(r.Inflight[name], 0)
		queued += max(r.Queued[name], 0)
	}
	return inflight, queued, gateways
}

// State is what the autoscaler knows of one service between decisions.
type State struct {
	// Current is the task group's count in the Nomad job.
	Current int
	// Inflight and Queued are the requests the fresh load reports count,
	// from Gateways gateways.
	Inflight, Queued int
	Gateways         int
	// LastChange is when a decision last changed Current.
	LastChange time.Time
	// BelowSince is when the wanted count first dropped below Current
	// (zero if it is not below), and WindowMax the most replicas wanted
	// since then: a scale-down goes to WindowMax, so a dip in the load
	// within the window does not take away replicas the rest of it needed.
	BelowSince time.Time
	WindowMax  int
	// AboveSince is when the wanted count first rose above Current (zero
	// if it is not above), for ScaleUpDelay.
	AboveSince time.Time
}

// Decide is the autoscaling rule, in the manner of Ray Serve's on ongoing
// requests: the replicas wanted are ceil((Inflight+Queued) / TargetInflight)
// within [Min, Max]. It scales up as soon as more are wanted (after
// ScaleUpDelay, if set, of wanting more), at once from zero when requests
// are queued, and down only after fewer have been wanted for
// ScaleDownDelay, to the most wanted during that time. A Current outside
// [Min, Max] is brought inside at once.
//
// It returns the count the group should have, a sentence saying why when
// that differs from s.Current (empty otherwise), and the state to pass to
// the next decision (with Current set to desired).
func Decide(as servekv.Autoscale, s State, now time.Time) (desired int, reason string, next State) {
	lo := max(as.Min, 0)
	hi := max(as.Max, lo)
	next = s
	base := min(max(s.Current, lo), hi)
	if base > s.Current {
		reason = fmt.Sprintf("%s is below the minimum of %d", replicas(s.Current), lo)
	} else if base < s.Current {
		reason = fmt.Sprintf("%s is above the maximum of %d", replicas(s.Current), hi)
	}
	desired = base

	load := max(s.Inflight, 0) + max(s.Queued, 0)
	target := as.TargetInflight
	if !(target > 0) {
		// No (or a nonsensical) target: one request per replica.
		target = 1
	}
	raw := int(min(math.Ceil(float64(load)/target), float64(math.MaxInt32)))
	want := min(max(raw, lo), hi)
	// Requests are held at a gateway and no replica exists to take them:
	// start one now, whatever the delays say.
	fromZero := s.Queued > 0 && s.Current == 0
	if fromZero {
		want = min(max(want, 1, lo), hi)
	}

	acted := false
	switch {
	case want > base:
		next.BelowSince, next.WindowMax = time.Time{}, 0
		if next.AboveSince.IsZero() {
			next.AboveSince = now
		}
		if fromZero || now.Sub(next.AboveSince) >= as.ScaleUpDelay.Std() {
			desired, acted = want, true
			reason = upReason(s, target, raw, want, fromZero)
		}
	case want < base:
		next.AboveSince = time.Time{}
		if next.BelowSince.IsZero() {
			next.BelowSince, next.WindowMax = now, want
		} else {
			next.WindowMax = max(next.WindowMax, want)
		}
		if now.Sub(next.BelowSince) >= as.ScaleDownDelay.Std() {
			desired, acted = min(max(next.WindowMax, lo), hi), true
			reason = downReason(s, target, next.WindowMax, as.ScaleDownDelay.Std())
		}
	default:
		next.AboveSince, next.BelowSince, next.WindowMax = time.Time{}, time.Time{}, 0
	}
	if acted {
		// A decision taken starts the next one afresh: a further
		// scale-down waits out a whole window of its own.
		next.AboveSince, next.BelowSince, next.WindowMax = time.Time{}, time.Time{}, 0
	}
	if desired == s.Current {
		return desired, "", next
	}
	next.Current, next.LastChange = desired, now
	return desired, fmt.Sprintf("%s: %d → %s", reason, s.Current, replicas(desired)), next
}

func upReason(s State, target float64, raw, want int, fromZero bool) string {
	var b strings.Builder
	if fromZero {
		fmt.Fprintf(&b, "%s queued with no replica to take %s", requests(s.Queued), pronoun(s.Queued))
		if s.Inflight > 0 {
			fmt.Fprintf(&b, " and %d in flight", s.Inflight)
		}
		fmt.Fprintf(&b, " %s", across(s.Gateways))
	} else {
		fmt.Fprintf(&b, "%s %s, target %s per replica", loadPhrase(s), across(s.Gateways), num(target))
	}
	if raw > want {
		fmt.Fprintf(&b, " (capped at the maximum of %d)", want)
	}
	return b.String()
}

func downReason(s State, target float64, windowMax int, delay time.Duration) string {
	return fmt.Sprintf("%s %s, target %s per replica, and no more than %s wanted for the last %s",
		loadPhrase(s), across(s.Gateways), num(target), replicas(windowMax), delay)
}

func loadPhrase(s State) string {
	if s.Queued > 0 {
		return fmt.Sprintf("%s in flight and %d queued", requests(s.Inflight), s.Queued)
	}
	return requests(s.Inflight) + " in flight"
}

func across(gateways int) string {
	switch gateways {
	case 0:
		return "with no gateway reporting"
	case 1:
		return "across 1 gateway"
	default:
		return fmt.Sprintf("across %d gateways", gateways)
	}
}

func requests(n int) string {
	if n == 1 {
		return "1 request"
	}
	return fmt.Sprintf("%d requests", n)
}

func pronoun(n int) string {
	if n == 1 {
		return "it"
	}
	return "them"
}

func replicas(n int) string {
	if n == 1 {
		return "1 replica"
	}
	return fmt.Sprintf("%d replicas", n)
}

// num writes a target as 2 or 1.5, not 2.000000.
func num(f float64) string { return fmt.Sprintf("%g", f) }
