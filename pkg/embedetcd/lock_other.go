//go:build !unix

package embedetcd

// lockedByOther: without flock there is nothing to probe; etcd's own open
// of its files is the only guard.
func lockedByOther(string) (bool, error) { return false, nil }
