//go:build tools

// Package tools pins the Nomad agent that the tests and the demo run. It lives
// in its own module so the product's go.mod stays small.
package tools

import _ "github.com/hashicorp/nomad"
