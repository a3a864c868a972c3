package lease

import (
	"context"
	"errors"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// TODO(lead): membership steps; in progress.
var errMembershipTODO = errors.New("lease: membership steps are not built yet")

func (s *Service) changeMembership(ctx context.Context, req *tenurev1.ChangeMembershipRequest) (*tenurev1.ChangeMembershipResponse, error) {
	return nil, errMembershipTODO
}

func (s *Service) completeMembershipChange(ctx context.Context, req *tenurev1.CompleteMembershipChangeRequest) (*tenurev1.CompleteMembershipChangeResponse, error) {
	return nil, errMembershipTODO
}

func (s *Service) deleteRange(ctx context.Context, req *tenurev1.DeleteRangeRequest) (*tenurev1.DeleteRangeResponse, error) {
	return nil, errMembershipTODO
}
