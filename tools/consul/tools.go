//go:build tools

// Package tools pins the Consul server that roam's tests and demos run against
// (`make consul` builds it once into ~/.cache/roam). Consul v1.14.11 is the last
// MPL-2.0 release; do not move past it.
package tools

import _ "github.com/hashicorp/consul"
