//go:build tools

// Package tools pins the Consul agent that the tests and the demo run.
package tools

import _ "github.com/hashicorp/consul"
