package sweepjob

import (
	"os"

	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// EnvKeyPrefix overrides where sweeps live in Consul KV; it must match the
// gpujob driver's sweep_key_prefix.
const EnvKeyPrefix = "GPUJOB_SWEEP_KEY_PREFIX"

// KeyPrefix is where sweeps live in Consul KV: $GPUJOB_SWEEP_KEY_PREFIX,
// else sweepkv.DefaultPrefix.
func KeyPrefix() string {
	if p := os.Getenv(EnvKeyPrefix); p != "" {
		return p
	}
	return sweepkv.DefaultPrefix
}
