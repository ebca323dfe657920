package nvml

import (
	"errors"
	"fmt"
)

// CheckHealth reads the conditions that make a GPU unfit for new work and
// returns why, or "" when none holds. Queries the device does not support
// count as healthy: a consumer card without ECC is not sick.
func CheckHealth(d Device) string {
	if _, err := d.UUID(); errors.Is(err, ErrGPULost) {
		return "NVML can no longer reach the GPU (fallen off the bus?)"
	}
	if n, err := d.ECCErrors(true); err == nil && n > 0 {
		return fmt.Sprintf("%d uncorrectable ECC error(s) since the driver loaded", n)
	}
	if pending, err := d.RetiredPagesPending(); err == nil && pending {
		return "retired memory pages are pending: the GPU needs a reset"
	}
	if rows, err := d.RemappedRows(); err == nil && rows.Failed {
		return "row remapping failed: the GPU needs servicing"
	}
	return ""
}

// Well-known Xids (NVIDIA's Xid catalogue), for health descriptions.
var xidNames = map[uint64]string{
	13:  "graphics engine exception",
	31:  "GPU memory page fault",
	32:  "invalid or corrupted push buffer stream",
	43:  "GPU stopped processing",
	45:  "preemptive cleanup",
	48:  "double-bit ECC error",
	61:  "internal micro-controller breakpoint/warning",
	62:  "internal micro-controller halt",
	63:  "ECC page retirement or row remapping recording event",
	64:  "ECC page retirement or row remapper recording failure",
	68:  "NVDEC0 exception",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	109: "context switch timeout",
	119: "GSP RPC timeout",
	120: "GSP error",
}

// XidDescription names an Xid, e.g. "Xid 79 (GPU has fallen off the bus)".
func XidDescription(xid uint64) string {
	if name, ok := xidNames[xid]; ok {
		return fmt.Sprintf("Xid %d (%s)", xid, name)
	}
	return fmt.Sprintf("Xid %d", xid)
}
