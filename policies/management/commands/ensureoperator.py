"""Make sure an operator (superuser) account exists, printing its credentials once."""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Create a superuser with a random password and print it. An existing account is "
        "left alone unless --reset is given, which gives it a new password."
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default="operator")
        parser.add_argument("--reset", action="store_true", help="give an existing account a new password")

    def handle(self, *args, username, reset, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is not None and not reset:
            self._say_account_exists(username)
            return
        password = secrets.token_urlsafe(18)
        if user is None:
            get_user_model().objects.create_superuser(username=username, password=password)
        else:
            self._reset(user, password)
        self.stdout.write(f"username: {username}")
        self.stdout.write(f"password: {password}")

    def _say_account_exists(self, username):
        # The password is stored hashed, so it cannot be shown again; say how to get a new one.
        self.stdout.write(
            f"The operator account {username!r} already exists; its password is unchanged.\n"
            f"To set a new one: python manage.py ensureoperator --username {username} --reset"
        )

    def _reset(self, user, password):
        # A reset also restores the rights, so it repairs an account that was demoted.
        user.set_password(password)
        user.is_active = user.is_staff = user.is_superuser = True
        user.save()
