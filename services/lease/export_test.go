package lease

import clientv3 "go.etcd.io/etcd/client/v3"

// WithStoreWrappers wraps the service's etcd KV and Lease clients, so a test
// can count what one request costs etcd.
func WithStoreWrappers(kv func(clientv3.KV) clientv3.KV, l func(clientv3.Lease) clientv3.Lease) Option {
	return func(s *Service) {
		s.kv = kv(s.kv)
		s.leases = l(s.leases)
	}
}
