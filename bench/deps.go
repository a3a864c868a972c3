//go:build tenuredeps

package bench

// This file is never compiled (its build tag is never set). It only keeps
// `go mod tidy` from dropping the require of github.com/tenurelog/tenure (and
// with it the replace to ../), so tenure's replica can be benchmarked beside
// JetStream in this module. Remove it once a tenure Appender imports tenure.
import _ "github.com/tenurelog/tenure/pkg/wire"
