package transport

import (
	"sync"

	"connectrpc.com/connect"
)

var (
	icMu sync.RWMutex
	ics  []connect.Interceptor
)

// SetInterceptors installs interceptors (tracing) used by every handler and
// client built afterwards. Call it once at process start, before building
// any handler or client.
func SetInterceptors(list ...connect.Interceptor) {
	icMu.Lock()
	defer icMu.Unlock()
	ics = append([]connect.Interceptor(nil), list...)
}

func interceptors() []connect.Interceptor {
	icMu.RLock()
	defer icMu.RUnlock()
	return ics
}
