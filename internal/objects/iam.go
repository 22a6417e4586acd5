package objects

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/versity/versitygw/auth"
	"github.com/versity/versitygw/s3err"
)

// IAM is versitygw's auth.IAMService over basalt's users: the users of
// `basalt user create` use S3 at once with the keys in their s3.env, and
// deleting a user revokes their keys on every node within the latency of
// an etcd watch (Users mirrors the records; a miss asks the store).
// Accounts are managed with the basalt CLI only; S3 admin calls are
// refused.
type IAM struct {
	Meta *meta.Store
	// Users, if set, answers lookups without a round trip (the store is
	// asked on a miss: a user created a moment ago on another node).
	Users *meta.Mirror[*meta.User]

	keys signingKeys // SigV4 signing keys by secret and scope (signing.go)
}

// userArn prefixes the basalt user name carried in Account.Arn, which
// versitygw's S3 layer does not use: the backend reads the caller's name
// from it (AccountUser).
const userArn = "user/"

// AccountUser is the basalt user name of an account IAM resolved ("" for
// accounts it did not make, such as the gateway's root).
func AccountUser(a auth.Account) string {
	name, _ := strings.CutPrefix(a.Arn, userArn)
	if name == a.Arn {
		return ""
	}
	return name
}

// lookupTimeout bounds one key resolution: a request must fail, not hang,
// when the metadata store is unreachable.
const lookupTimeout = 5 * time.Second

// GetUserAccount implements auth.IAMService: access key → account. basalt
// admins are S3 admins (every bucket); other users may create buckets and
// use their own (RoleUserPlus). A user mapped to a uid/gid carries them.
func (i *IAM) GetUserAccount(access string) (auth.Account, error) {
	if i.Users != nil {
		if u, ok := i.Users.Get(access); ok {
			return Account(u), nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	u, err := i.Meta.UserByAccessKey(ctx, access)
	if err != nil {
		if errs.IsCode(err, errs.CodeNotFound) {
			return auth.Account{}, auth.ErrNoSuchUser
		}
		return auth.Account{}, err
	}
	return Account(u), nil
}

// Account is user u as an S3 account: keys, role, uid mapping.
func Account(u *meta.User) auth.Account {
	a := auth.Account{Access: u.AccessKeyID, Secret: u.SecretKey, Role: auth.RoleUserPlus, Arn: userArn + u.Name}
	if u.Admin {
		a.Role = auth.RoleAdmin
	}
	if u.UID != nil {
		a.UserID = *u.UID
	}
	if u.GID != nil {
		a.GroupID = *u.GID
	}
	return a
}

// ResolveAccounts implements auth.IAMService: the access keys that belong
// to no user.
func (i *IAM) ResolveAccounts(accessKeyIDs []string) ([]string, error) {
	missing := []string{}
	for _, a := range accessKeyIDs {
		if _, err := i.GetUserAccount(a); err != nil {
			if !errors.Is(err, auth.ErrNoSuchUser) {
				return nil, err
			}
			missing = append(missing, a)
		}
	}
	return missing, nil
}

// ListUserAccounts implements auth.IAMService.
func (i *IAM) ListUserAccounts() ([]auth.Account, error) {
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	us, err := i.Meta.Users(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]auth.Account, 0, len(us))
	for _, u := range us {
		if u.AccessKeyID != "" {
			out = append(out, Account(u))
		}
	}
	return out, nil
}

var errManagedByBasalt = s3err.GetAPIError(s3err.ErrAdminMethodNotSupported)

// CreateAccount implements auth.IAMService: refused (basalt user create).
func (i *IAM) CreateAccount(auth.Account) error { return errManagedByBasalt }

// UpdateUserAccount implements auth.IAMService: refused.
func (i *IAM) UpdateUserAccount(string, auth.MutableProps) error { return errManagedByBasalt }

// DeleteUserAccount implements auth.IAMService: refused (basalt user delete).
func (i *IAM) DeleteUserAccount(string) error { return errManagedByBasalt }

// Shutdown implements auth.IAMService.
func (i *IAM) Shutdown() error { return nil }

var _ auth.IAMService = (*IAM)(nil)
