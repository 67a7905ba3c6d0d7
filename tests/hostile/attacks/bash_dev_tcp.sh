# Bash: a /dev/tcp redirection to the host listener, and cat of the planted
# host secret. Plain redirections only: the reason is on stderr.
echo START
if ( exec 3<>"/dev/tcp/127.0.0.1/$PORT" ); then
  echo "ALLOWED bash-tcp"
else
  echo "BLOCKED bash-tcp $?"
fi
if cat "$HOST_SECRET_PATH"; then
  echo "LEAK bash-cat"
else
  echo "BLOCKED bash-cat $?"
fi
echo DONE
